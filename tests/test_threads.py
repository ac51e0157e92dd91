"""A thread of the engine that an exception kills is a finding (oracle/threads.py), at
each level, with its shrunk program; the hook in place before is back afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle import campaign, threads
from kvoracle.oracle.campaign import replay, run_machine
from kvoracle.oracle.engines import file_module
from kvoracle.oracle.findings import Last, confirms, fails_with, reproduction, run_reproduction
from kvoracle.oracle.engine_campaign import engine_machine
from kvoracle.oracle.engines.reference import ReferenceAdapter
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.targets import Target
from kvoracle.oracle.engine import BadInput
from kvoracle.oracle.violations import PropertyViolated
from kvoracle.spec.types import Ok, Outcome, RequestId, TransferId


def on_worker(work: Callable[[], None], name: str | None = "io-worker") -> None:
    """Run `work` on a thread of its own and wait for it, as an engine waits for its I/O worker."""
    worker = threading.Thread(target=work, name=name)
    worker.start()
    worker.join()


class CompletionWorkerDies(ReferenceCache):
    """Completes transfers on a worker, which an answer other than ok kills before the
    transfer is completed."""

    name = "completion-worker-dies"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        def work() -> None:
            if not isinstance(outcome, Ok):
                raise OSError(f"storage answered {outcome}")
            ReferenceCache.complete(self, t, outcome)

        on_worker(work)


class PollerDies(ReferenceScheduler):
    """Polls its running requests' I/O on a worker at each tick, which dies when a
    request is running."""

    name = "poller-dies"

    def tick(self, n: int) -> None:
        super().tick(n)

        def work() -> None:
            if self.running():
                raise TimeoutError("the storage poller gave up")

        on_worker(work)


class FinishWorkerDies(ReferenceAdapter):
    """Frees a finished request's blocks on a worker, which dies once the engine holds
    two requests' worth of blocks, before it frees any."""

    name = "finish-worker-dies"

    def finish(self, rid: str) -> None:
        def work() -> None:
            if len(self.observe().tables or {}) > 1:
                raise RuntimeError("the free list's lock was poisoned")
            ReferenceAdapter.finish(self, rid)

        on_worker(work)


def machine_of(engine: type, level: str) -> type[RuleBasedStateMachine]:
    if level == "request":
        return engine_machine(engine, bad_input=False)
    return Target(engine.__name__, level, None, engine).machine()


@pytest.mark.parametrize(("engine", "level"), [(CompletionWorkerDies, "cache"), (PollerDies, "scheduler"),
                                               (FinishWorkerDies, "request")])
def test_a_thread_the_engine_loses_to_an_exception_is_a_finding_with_its_program(engine: type, level: str) -> None:
    before = threading.excepthook
    machine = machine_of(engine, level)
    result = run_machine(machine, seed_value=0, examples=30, steps=30)
    assert threading.excepthook is before
    assert not result.passed and result.first_id == "VALID-INPUT"
    assert "thread 'io-worker' died" in str(result.violation), result.violation
    assert "at tests/test_threads.py:" in str(result.violation) and " in work" in str(result.violation)
    assert result.counterexample
    again = replay(machine, result.counterexample)
    assert again is not None and str(again.violations) == str(result.violation.violations)  # type: ignore[union-attr]


class ExitingPoller(ReferenceScheduler):
    """Its poller ends itself by SystemExit at each tick: a thread's way to end, no death."""

    def tick(self, n: int) -> None:
        super().tick(n)

        def work() -> None:
            raise SystemExit(0)

        on_worker(work)


def test_a_thread_that_ends_by_system_exit_is_no_finding() -> None:
    assert run_machine(machine_of(ExitingPoller, "scheduler"), seed_value=0, examples=10, steps=20).passed


def test_a_reproduction_fails_where_a_thread_of_the_engine_dies_in_its_last_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # as in a script (pytest has its own)

    def work() -> None:
        raise OSError("the disk is gone")

    with Last() as last:
        on_worker(work)
    assert threading.excepthook is threading.__excepthook__
    with pytest.raises(AssertionError, match=r"VALID-INPUT: .*thread 'io-worker' died: it raised OSError"):
        fails_with("VALID-INPUT", "", {}, raised=last.error)
    with Last() as calm:
        on_worker(lambda: None)
    fails_with("VALID-INPUT", "", {}, raised=calm.error)  # no death: passes


POLLER = """
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler


class ScriptedPollerDies(ReferenceScheduler):
    name = "scripted-poller-dies"

    def tick(self, n):
        super().tick(n)
        if self.running():  # the engine's own code, which the reproduction runs too
            self.run("import threading as t; w = t.Thread(target=lambda: 1 / 0, name='io-worker'); w.start(); w.join()")
"""


def test_the_reproduction_of_a_thread_death_fails_standalone(tmp_path: Path) -> None:
    (tmp_path / "poller.py").write_text(POLLER)
    engine = file_module(tmp_path / "poller.py").ScriptedPollerDies
    machine = machine_of(engine, "scheduler")
    result = run_machine(machine, seed_value=0, examples=30, steps=30)
    assert result.first_id == "VALID-INPUT" and "thread 'io-worker' died" in str(result.violation)
    (tmp_path / "repro.py").write_text(reproduction(machine, result.counterexample, result.violation))  # type: ignore[arg-type]
    failure = run_reproduction(tmp_path / "repro.py")
    assert confirms(failure, "VALID-INPUT") and "thread 'io-worker' died: it raised ZeroDivisionError" in failure


class UnnamedWorkerDies(ReferenceCache):
    """CompletionWorkerDies with a worker Python names itself (Thread-<count> (work))."""

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        def work() -> None:
            if not isinstance(outcome, Ok):
                raise OSError(f"storage answered {outcome}")
            ReferenceCache.complete(self, t, outcome)

        on_worker(work, name=None)


def test_a_default_thread_name_is_reported_without_its_process_wide_count() -> None:
    machine = machine_of(UnnamedWorkerDies, "cache")
    result = run_machine(machine, seed_value=0, examples=30, steps=30)
    assert "thread 'Thread (work)' died" in str(result.violation), result.violation
    again = replay(machine, result.counterexample)  # other threads were made meanwhile: the same finding
    assert again is not None and str(again.violations) == str(result.violation.violations)  # type: ignore[union-attr]


def started_until_told(name: str) -> tuple[threading.Thread, threading.Event]:
    """A worker already running, which dies (OSError) once the event is set."""
    go = threading.Event()

    def dies_when_told() -> None:
        go.wait()
        raise OSError(f"{name}'s disk is gone")

    worker = threading.Thread(target=dies_when_told, name=name)
    worker.start()
    return worker, go


def test_a_thread_older_than_the_program_is_named_as_such_when_it_dies() -> None:
    """A death is charged to the program being watched, whose replay may not have the
    thread: one that was already running when the program's build began says so."""
    older, go = started_until_told("old-worker")
    try:
        with threads.building():
            on_worker(lambda: (_ for _ in ()).throw(OSError("this program's worker")), name="new-worker")
            go.set()
            older.join()
    except PropertyViolated as e:
        found = [v.message for v in e.violations]
    assert len(found) == 2, found
    assert "thread 'new-worker' died" in found[0]
    assert "thread 'old-worker', left running by an earlier program or the harness, died" in found[1]


def test_a_reproduction_names_a_worker_its_own_lines_started_as_the_engines() -> None:
    """A reproduction watches only its last call (findings.Last): a worker its earlier
    lines started is the engine's, and its death reads as in the campaign."""
    worker, go = started_until_told("io-worker")
    threads.watch()
    try:
        go.set()
        worker.join()
        found = [v.message for v in threads.died("the last call")]
    finally:
        threads.unwatch()
    assert len(found) == 1 and "thread 'io-worker' died" in found[0], found


class BadCallWorkerDies(ReferenceCache):
    """Refuses a bad call as it must, but the worker that checked it dies."""

    def bad_call(self, kind: BadInput, r: RequestId | None) -> bool:
        on_worker(lambda: (_ for _ in ()).throw(RuntimeError("the validator crashed")))
        return super().bad_call(kind, r)


def test_a_thread_that_dies_in_a_bad_call_is_that_calls_finding() -> None:
    result = run_machine(machine_of(BadCallWorkerDies, "cache"), seed_value=0, examples=30, steps=30)
    assert result.first_id == "VALID-INPUT" and "the validator crashed" in str(result.violation)
    assert result.counterexample[-1].startswith("state.bad_input("), result.counterexample


class FailsToBuild(ReferenceCache):
    def __init__(self) -> None:
        raise OSError("no device")


def test_a_machine_whose_engine_fails_to_build_leaves_the_hook_as_it_was() -> None:
    before = threading.excepthook
    with pytest.raises(OSError, match="no device"):
        machine_of(FailsToBuild, "cache")()
    assert threading.excepthook is before


def test_a_death_never_reported_goes_to_the_hook_that_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda death: seen.append(repr(death.exc_value)))
    threads.watch()
    on_worker(lambda: (_ for _ in ()).throw(OSError("after the last check")))
    threads.unwatch()
    assert seen == ["OSError('after the last check')"]


STRANDED: list[str] = []  # what the engine's own hook saw


def _engine_hook(death: threading.ExceptHookArgs) -> None:
    STRANDED.append(repr(death.exc_value))


class OwnHookAtBuild(PollerDies):
    """An engine whose build installs a thread hook of its own (as the SGLang HiCache
    adapter's script does, to model what a dead controller thread strands)."""

    name = "own-hook-at-build"

    def __init__(self) -> None:
        super().__init__()
        threading.excepthook = _engine_hook


def test_an_engine_whose_build_installs_its_own_hook_keeps_its_deaths() -> None:
    """Its hook takes the deaths over (the machine reports none of its own), and the hook
    in place before the campaign is back afterwards."""
    before = threading.excepthook
    STRANDED.clear()
    try:
        result = run_machine(machine_of(OwnHookAtBuild, "scheduler"), seed_value=0, examples=30, steps=30)
    finally:
        threading.excepthook = before
    assert result.passed, result.violation
    assert STRANDED and all("the storage poller gave up" in death for death in STRANDED)


def dying_at_build(base: type) -> type:
    """`base`, whose build connects to its storage on a worker that dies doing so."""
    def __init__(self: object) -> None:
        getattr(base, "__init__")(self)

        def work() -> None:
            raise ConnectionRefusedError("the storage service refused the connection")

        on_worker(work, "storage-connect")

    return type(f"{base.__name__}DiesAtBuild", (base,), {"__init__": __init__, "name": "dies-at-build"})


@pytest.mark.parametrize(("engine", "level"), [(ReferenceCache, "cache"), (ReferenceScheduler, "scheduler"),
                                               (ReferenceAdapter, "request")])
@pytest.mark.parametrize("generator", campaign.DRAWERS)
def test_a_thread_that_dies_while_the_engine_is_built_is_a_finding(engine: type, level: str, generator: str) -> None:
    """The build's own finding, with no program (before 2026-12-06 Python's hook printed
    it and the campaign went on without it)."""
    before = threading.excepthook
    campaign.set_generator(generator)
    try:
        result = run_machine(machine_of(dying_at_build(engine), level), seed_value=0, examples=5, steps=5)
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    assert threading.excepthook is before
    assert not result.passed and result.first_id == "VALID-INPUT", result.violation
    message = str(result.violation)
    assert "by the end of the engine's build, thread 'storage-connect' died" in message, message
    assert "ConnectionRefusedError" in message and result.counterexample == ()
