"""A thread of the engine that an exception kills is a finding (oracle/threads.py), at
each level, with its shrunk program; the hook in place before is back afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.campaign import replay, run_machine
from kvoracle.oracle.engine_campaign import engine_machine
from kvoracle.oracle.engines.reference import ReferenceAdapter
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.targets import Target
from kvoracle.spec.types import Ok, Outcome, TransferId


def on_worker(work: Callable[[], None]) -> None:
    """Run `work` on a thread of its own and wait for it, as an engine waits for its I/O worker."""
    worker = threading.Thread(target=work, name="io-worker")
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
