"""An engine that ends its process (os._exit, a crash in native code, the OOM killer)
ends only its campaign, as a VALID-INPUT finding with a shrunk program and, for a
Scripted adapter, a reproduction that ends its process the same way."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import hypothesis
import pytest

import kvoracle.testing
from kvoracle.oracle import survival, watchdog
from kvoracle.oracle.cli import Job, Settings, campaign_of, run_jobs
from kvoracle.oracle.engine import BadInput
from kvoracle.oracle.engine_campaign import run_engine
from kvoracle.oracle.engines import adapter_class
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.findings import run_reproduction
from kvoracle.oracle.isolation import Ended, in_children
from kvoracle.oracle.targets import Target
from kvoracle.oracle.violations import PropertyViolated
from kvoracle.oracle.workers import LOCAL
from kvoracle.spec.actions import EvictStep
from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.spec.types import Outcome, RequestId, TransferId

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "docs" / "examples" / "toy_engine.py"


def ends(x: int) -> int:
    if x == 1:
        os._exit(7)
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
    if x == 3:
        raise ValueError("an error, not an ending")
    return x * 10


def test_each_piece_answers_or_says_how_its_process_ended() -> None:
    got = list(in_children(ends, [0, 1, 2, 4], 2))
    assert got[0] == 0 and got[3] == 40
    assert isinstance(got[1], Ended) and got[1].status == 7 and str(got[1]) == "exited with status 7"
    assert isinstance(got[2], Ended) and str(got[2]) == "killed by SIGKILL"
    with pytest.raises(ValueError, match="an error, not an ending") as raised:
        list(in_children(ends, [3], 1))
    assert "raised in a child process" in "".join(raised.value.__notes__)


def leaves_a_temporary_directory(how: int) -> str:
    where = tempfile.mkdtemp()
    Path(where, "block").write_bytes(b"kv")
    if how == 1:
        os._exit(7)  # its finalizers and atexit handlers never run
    if how == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return where


def test_what_a_child_leaves_in_its_temporary_directory_goes_however_it_ended(tmp_path: Path) -> None:
    before = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        answers = list(in_children(leaves_a_temporary_directory, [0, 1, 2], 2))
    finally:
        tempfile.tempdir = before
    assert isinstance(answers[0], str) and Path(answers[0]).parent.parent == tmp_path  # it wrote under the child's own
    assert [type(a) for a in answers[1:]] == [Ended, Ended]
    assert list(tmp_path.iterdir()) == []


def test_a_journaled_machine_draws_the_same_programs(tmp_path: Path) -> None:
    target = Target("reference", "cache", None, ReferenceCache)
    plain = campaign_of(target, [0], 10, 30)
    journaled = campaign_of(target, [0], 10, 30, journal=tmp_path / "journal")
    assert plain[1] == journaled[1]  # the same steps, faults, bad inputs, rules and outcomes
    assert (tmp_path / "journal").read_text().endswith("state.teardown()\n")


class SegfaultingCache(ReferenceCache):
    """An engine whose native code dereferences a null pointer once three transfers fly."""

    name = "segfaulting"
    flying = 3  # the transfers in flight that crash it

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        if len(self.in_flight()) >= self.flying:
            ctypes.string_at(0)
        super().complete(t, outcome)


class DrainEndingCache(ReferenceCache):
    """An engine that ends the process when asked to evict its whole CPU tier at once:
    only the teardown's drain asks that (a step asks for 4 blocks at most)."""

    name = "drain-ending"
    cpu_blocks = 5

    def evict_cpu(self, n: int) -> tuple[EvictStep, ...]:
        if n == self.cpu_blocks:
            os._exit(4)
        return super().evict_cpu(n)


def test_an_engine_that_ends_its_process_is_a_finding_and_the_campaign_goes_on() -> None:
    jobs = [Job(Target(a.name, "cache", None, a), [0], 30, 40, False, Settings(step_timeout=0))
            for a in (SegfaultingCache, ReferenceCache)]
    crashed, after = run_jobs(jobs, 1, None)
    assert after.verdict == "pass"
    assert crashed.verdict == "VIOLATION" and crashed.first_id == "VALID-INPUT"
    assert crashed.result is not None and crashed.result.ended is not None
    found, steps = crashed.result.violation, crashed.result.counterexample
    assert found is not None and "the engine ended the process (killed by SIGSEGV)" in str(found)
    assert steps and steps[-1].startswith(f"state.{found.step}(")  # it ended in the program's last step
    assert f"in step {len(steps)}, {found.step}" in str(found)


class AbortingScheduler(ReferenceScheduler):
    """An engine whose native fault handler aborts (a failed CHECK) when a preemption's
    storage or swap I/O meets a fault."""

    name = "aborting"

    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None:
        if any(f.kind is not FaultKind.OK for f in faults):
            os.kill(os.getpid(), signal.SIGABRT)
        super().preempt(r, faults)


def test_an_ending_under_drawn_faults_replays_and_shrinks() -> None:
    """The scheduler machine's steps carry faults drawn through a function (`_faults(n)`
    in the journal): the replays must end the same way for the program to shrink."""
    [row] = run_jobs([Job(Target("aborting", "scheduler", None, AbortingScheduler), [0], 60, 40, False)], 1, None)
    assert row.result is not None and row.result.violation is not None
    found = str(row.result.violation)
    assert "the engine ended the process (killed by SIGABRT)" in found and "did not end the process again" not in found
    steps = row.result.counterexample
    assert steps[-1].startswith("state.preempt(f=_faults(") and len(steps) <= 4  # a request admitted, then preempted


class NativeHangCache(ReferenceCache):
    """An engine stuck where SIGALRM cannot reach once three transfers fly (the signal is
    blocked, as in native code that never returns to Python): the watchdog cannot
    interrupt it; only the parent, which sees no sign of life, can end it."""

    name = "native-hang"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        if len(self.in_flight()) >= 3:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        super().complete(t, outcome)


def test_an_engine_stuck_where_no_timer_reaches_is_killed_and_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "LIMIT", [1.0])
    monkeypatch.setattr(survival, "GRACE", [2.0])  # silent for 3 s: killed
    monkeypatch.setattr(watchdog, "AFTER_HANG", 0.5)
    monkeypatch.setattr(survival, "REPLAY_GRACE", 0.5)  # a replay silent for 1 s: killed
    jobs = [Job(Target(a.name, "cache", None, a), [0], 30, 40, False, Settings(step_timeout=1))
            for a in (NativeHangCache, ReferenceCache)]
    stuck, after = run_jobs(jobs, 1, None)
    assert after.verdict == "pass"
    assert stuck.result is not None and stuck.result.ended is not None and stuck.result.ended.silent == 3.0
    found = str(stuck.result.violation)
    assert "gave no sign of life for 3 s" in found and "did not end the process again" not in found
    steps = stuck.result.counterexample  # shrunk by replays that went silent too
    assert steps and steps[-1].startswith(f"state.{stuck.result.violation.step}(")  # type: ignore[union-attr]


def test_an_ending_in_the_drain_is_reported_there() -> None:
    [row] = run_jobs([Job(Target("drain-ending", "cache", None, DrainEndingCache), [0], 10, 20, False)], 1, None)
    assert row.result is not None
    assert "the engine ended the process (exited with status 4) in the teardown's drain" in str(row.result.violation)


def test_a_scripted_engine_that_ends_its_process_gets_a_reproduction_that_ends_too(tmp_path: Path) -> None:
    """The toy engine with its planted bug fixed and a fatal-error handler that exits when
    a request finishes while three run."""
    fixed = TOY.read_text().replace(
        "self.free_list.append(b)  # BUG: the hash map still points at b",
        "self.free_list.append(b)\n            self.cached = {h: x for h, x in self.cached.items() if x != b}")
    fatal = "    def finish(self, rid: str) -> None:\n"
    ending = fixed.replace(fatal, fatal + "        if len(self.tables) >= 3:\n            os._exit(9)\n", 1)
    assert ending != fixed and "BUG" not in fixed
    (tmp_path / "ending_engine.py").write_text(ending.replace("from toy_engine import", "from ending_engine import"))
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           f"{tmp_path}/ending_engine.py:ToyAdapter", "--seeds", "1", "--examples", "40",
                           "--repro-dir", str(tmp_path / "repro")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout.count("the engine ended the process (exited with status 9)") == 2  # valid, then bad input
    assert "fails standalone with ProcessEnded: exited with status 9" in done.stdout
    assert re.search(r"^toy\s+-\s+-\s+-\s+-\s+VIOLATION\s+VALID-INPUT", done.stdout, re.M)  # its counts ended with it
    [repro, *_] = sorted((tmp_path / "repro").glob("toy_finish_valid_input.py"))
    assert run_reproduction(repro) == "ProcessEnded: exited with status 9"
    (tmp_path / "ending_engine.py").write_text(fixed.replace("from toy_engine import", "from ending_engine import"))
    assert run_reproduction(repro) == ""  # the engine fixed: the same calls pass


def test_an_engine_that_exits_on_a_bad_call_is_a_finding_not_a_refusal(tmp_path: Path) -> None:
    class Exiting(adapter_class("reference")):  # type: ignore[misc]
        def bad_input(self, kind: BadInput, rid: str | None) -> bool:
            raise SystemExit(2)  # a request-validation error handled as fatal

    row = run_engine(Exiting, True, [0], 30, 20, tmp_path)
    found = row.result.violation
    assert found is not None and found.first_id == "VALID-INPUT"
    assert "the engine exited the process on the bad call" in str(found)
    assert row.result.counterexample == (row.result.counterexample[0],)  # shrunk to the bad call alone
    assert row.result.counterexample[0].startswith("state.bad_input(")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_on_a_ray_cluster_a_worker_the_engine_ended_is_a_finding_and_the_campaign_goes_on() -> None:
    from ray import cloudpickle  # the Ray workers cannot import this test file: send its classes by value

    getattr(cloudpickle, "register_pickle_by_value")(sys.modules[__name__])  # untyped
    jobs = [Job(Target(a.name, "cache", None, a), [0], 30, 40, False, Settings(step_timeout=0))
            for a in (SegfaultingCache, ReferenceCache)]
    crashed, after = run_jobs(jobs, 1, None, ray=LOCAL)
    assert after.verdict == "pass" and crashed.first_id == "VALID-INPUT"
    assert crashed.result is not None and "the engine ended the process (its worker died) in step" in str(crashed.result.violation)
    assert crashed.result.counterexample  # the local cluster's worker wrote the journal on this machine's disk


class SoonSegfaultingCache(SegfaultingCache):
    """SegfaultingCache's crash once two transfers fly (a test's own programs reach three seldom)."""

    name = "soon-segfaulting"
    flying = 2


def test_in_an_engines_own_tests_an_isolated_machine_fails_its_test_where_the_engine_ends_the_process() -> None:
    config = hypothesis.settings(max_examples=30, stateful_step_count=40, database=None, deadline=None, derandomize=True)
    crashing = kvoracle.testing.cache_machine(SoonSegfaultingCache, settings=config, isolated=True).TestCase()
    with pytest.raises(PropertyViolated, match=r"ended the process \(killed by SIGSEGV\) in step \d+, \w+") as raised:
        crashing.runTest()
    program = "".join(raised.value.__notes__).partition("the program that ended it:\n")[2].splitlines()
    assert program and program[-1].startswith(f"state.{raised.value.step}(")  # the step it ended in comes last
    kvoracle.testing.cache_machine(ReferenceCache, settings=config, isolated=True).TestCase().runTest()


ENDING_PLUGIN_ENGINE = '''
import os
from kvoracle.oracle.engines.reference_cache import ReferenceCache

class EndingCache(ReferenceCache):
    name = "ending"

    def complete(self, t, outcome):
        if len(self.in_flight()) >= 2:
            os._exit(9)  # a fatal-error handler
        super().complete(t, outcome)
'''


def test_the_pytest_plugin_isolated_reports_an_ending_as_a_failed_test_and_the_session_goes_on(tmp_path: Path) -> None:
    (tmp_path / "ending_engine.py").write_text(ENDING_PLUGIN_ENGINE)
    (tmp_path / "test_own.py").write_text("def test_the_engines_own_test():\n    pass\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvoracle-adapter",
               "ending_engine.py:EndingCache", "--kvoracle-examples", "30", "--kvoracle-steps", "40", "test_own.py"]
    alone = subprocess.run([*command, "--kvoracle-isolated"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert alone.returncode == 1, alone.stdout[-3000:] + alone.stderr[-2000:]
    assert "1 failed, 1 passed" in alone.stdout
    assert "the engine ended the process (exited with status 9) in step" in alone.stdout
    assert "the program that ended it:" in alone.stdout
    shared = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert shared.returncode == 9 and "passed" not in shared.stdout  # without it, the session ends with the engine


# --- what an engine does to the process that writes its reproduction ---------------------------

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
_TOY: object = __import__("toy_engine").ToyAdapter  # docs/examples/toy_engine.py
_WRITER = os.getpid()  # the process that runs the campaigns' parent side (and writes reproductions)


class OwnBaseException(BaseException):
    """Not an Exception: what an engine's own error class may derive from."""


class RaisesItsOwnBaseException(_TOY):  # type: ignore[misc,valid-type]
    name = "own_base_exception"

    def finish(self, rid: str) -> object:
        raise OwnBaseException("the engine's own")


class EndsTheWritersProcess(_TOY):  # type: ignore[misc,valid-type]
    """Ends the process that replays its program to write the reproduction (a fatal error
    that struck the replay, not the campaign)."""

    name = "ends_the_writer"

    def finish(self, rid: str) -> object:
        if os.getpid() == _WRITER:
            os._exit(7)
        return super().finish(rid)


def test_a_base_exception_of_the_engines_own_is_a_finding_not_the_end(tmp_path: Path) -> None:
    row = run_engine(RaisesItsOwnBaseException, False, [0], 20, 20, tmp_path)
    assert row.result.first_id == "VALID-INPUT" and "OwnBaseException" in str(row.result.violation)


def test_the_replay_that_writes_a_reproduction_cannot_end_the_campaigns_process(tmp_path: Path) -> None:
    row = run_engine(EndsTheWritersProcess, False, [0], 20, 20, tmp_path)  # the campaign itself runs in a child
    assert row.result.first_id == "INV-NO-UAF"  # the toy's own bug: found in the campaign's process
    assert row.reproduction is not None and row.reproduction.exists()  # and this process is still here


class ForksAHelper(_TOY):  # type: ignore[misc,valid-type]
    """Each finish forks a process that outlives the call (an engine's helper), in its
    script: the campaign, the replay and the reproduction all start some."""

    name = "forks_a_helper"
    pids = ""  # the file the helpers write their pids to

    def finish(self, rid: str) -> object:
        self.run(f"import os, time\nif os.fork() == 0:\n    open({self.pids!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
                 "    time.sleep(600)\n    os._exit(0)")
        return super().finish(rid)


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except (FileNotFoundError, IndexError):
        return False


def test_processes_an_engine_forks_neither_hold_the_campaign_nor_outlive_it(tmp_path: Path) -> None:
    """They inherit the answer's pipe (and the reproduction's stderr): once the process
    they came from is done, nothing waits for them, and they are killed with it."""
    pids = tmp_path / "helpers"
    helper = type("ForksAHelperHere", (ForksAHelper,), {"pids": str(pids)})
    start = time.perf_counter()
    row = run_engine(helper, False, [0], 20, 20, tmp_path)
    assert time.perf_counter() - start < 120  # it waited for the helpers' 600 s before
    assert row.result.first_id == "INV-NO-UAF" and row.reproduction is not None
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.perf_counter() + 30  # SIGKILL is delivered, not waited for: give a loaded machine time
    while [p for p in started if running(p)] and time.perf_counter() < deadline:
        time.sleep(0.1)
    assert started and not [p for p in started if running(p)]
