"""Campaigns: a target that raises is a finding, not a crash; a baseline turns known
violations into "known" and the campaign goes on to find the new ones."""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvoracle.kvcache.faults import FaultKind
from kvoracle.oracle import campaign, garbage
from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.campaign import readable, replay, run_machine, shown
from kvoracle.oracle import cli
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.engines import file_module
from kvoracle.oracle.findings import confirms, reproduction, run_reproduction, with_hash_seed
from kvoracle.oracle.mutants import Mutant, NoTimeout
from kvoracle.oracle.scheduler_machine import use_faults
from kvoracle.oracle.targets import Target
from kvoracle.oracle.violations import PropertyViolated
from kvoracle.spec.invariants import Violation
from kvoracle.spec.types import Outcome, TransferId
from kvoracle.oracle.engine import Observation

ROOT = Path(__file__).resolve().parent.parent


class RaisingCache(ReferenceCache):
    """An engine whose transfer completion blows up."""

    name = "raising"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        raise RuntimeError("the engine crashed completing a transfer")


class RaisingScheduler(ReferenceScheduler):
    """An engine whose observation code blows up after a while (an adapter bug)."""

    name = "raising-observe"

    def observe(self):  # type: ignore[no-untyped-def]
        if len(self.rm.requests) > 2:
            raise KeyError("the adapter read a field the engine does not have")
        return super().observe()


def test_a_raising_target_is_a_finding_with_an_id_and_the_campaign_goes_on() -> None:
    rows = [run_target(Target(a.name, level, None, a), [0], 30, 30)
            for a, level in ((RaisingCache, "cache"), (RaisingScheduler, "scheduler"), (ReferenceCache, "cache"))]
    assert [r.verdict for r in rows] == ["VIOLATION", "VIOLATION", "pass"]
    assert rows[0].first_id == "VALID-INPUT" and "crashed completing" in str(rows[0].result.violation)  # type: ignore[union-attr]
    assert rows[1].first_id == "VALID-INPUT" and "KeyError" in str(rows[1].result.violation)  # type: ignore[union-attr]
    assert rows[0].shrunk >= 1 and rows[1].shrunk >= 1


class ExitingCache(ReferenceCache):
    """An engine whose fatal-error handler exits the process when a transfer ends."""

    name = "exiting"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        sys.exit(3)


def test_an_engine_that_exits_the_process_is_a_finding_and_the_campaign_goes_on() -> None:
    rows = [run_target(Target(a.name, "cache", None, a), [0], 10, 20) for a in (ExitingCache, ReferenceCache)]
    assert [r.verdict for r in rows] == ["VIOLATION", "pass"]
    assert rows[0].first_id == "VALID-INPUT" and "SystemExit(3)" in str(rows[0].result.violation)  # type: ignore[union-attr]


class InterruptingCache(ReferenceCache):
    """An engine that raises KeyboardInterrupt by itself (a fatal-error handler's choice)
    when a transfer ends: no Ctrl-C was pressed."""

    name = "interrupting"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        raise KeyboardInterrupt


class CtrlCCache(ReferenceCache):
    """A user presses Ctrl-C while a transfer completes: the process receives SIGINT."""

    name = "ctrl-c"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # Python runs the signal's handler here


def test_an_engines_own_keyboard_interrupt_is_a_finding_and_the_campaign_goes_on() -> None:
    rows = [run_target(Target(a.name, "cache", None, a), [0], 10, 20) for a in (InterruptingCache, ReferenceCache)]
    assert [r.verdict for r in rows] == ["VIOLATION", "pass"]
    assert rows[0].first_id == "VALID-INPUT" and "KeyboardInterrupt" in str(rows[0].result.violation)  # type: ignore[union-attr]
    assert rows[0].shrunk >= 1


class InterruptedWhenBuilt(ReferenceCache):
    """An engine that raises KeyboardInterrupt as it is built, outside any call the
    machine makes into it."""

    name = "interrupted-when-built"

    def __init__(self) -> None:
        raise KeyboardInterrupt("the engine's own")


def test_an_engines_own_keyboard_interrupt_outside_a_call_is_a_finding_and_replays_as_one() -> None:
    row = run_target(Target(InterruptedWhenBuilt.name, "cache", None, InterruptedWhenBuilt), [0], 5, 5)
    assert row.verdict == "VIOLATION" and "KeyboardInterrupt(\"the engine's own\")" in str(row.result.violation)  # type: ignore[union-attr]
    again = replay(Target(InterruptedWhenBuilt.name, "cache", None, InterruptedWhenBuilt).machine(), ())
    assert again is not None and str(again.violations) == str(row.result.violation.violations)  # type: ignore[union-attr]


class InterruptedWhenObserved(ReferenceCache):
    """An engine that raises KeyboardInterrupt by itself when observed once a transfer
    has ended: outside the calls into it the machine checks, after a program of steps."""

    name = "interrupted-when-observed"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        super().complete(t, outcome)
        self.ended = True

    def observe(self) -> Observation:
        if getattr(self, "ended", False):
            raise KeyboardInterrupt("the engine's own, observed")
        return super().observe()


def test_an_engines_own_keyboard_interrupt_outside_a_call_comes_with_its_shrunk_program() -> None:
    target = Target(InterruptedWhenObserved.name, "cache", None, InterruptedWhenObserved)
    row = run_target(target, [0], 10, 20)
    assert row.first_id == "VALID-INPUT" and "the engine's own, observed" in str(row.result.violation)  # type: ignore[union-attr]
    steps = row.result.counterexample  # type: ignore[union-attr]
    assert steps  # the steps that ended a transfer (the engine raised nothing before)
    again = replay(target.machine(), steps)
    assert again is not None and str(again.violations) == str(row.result.violation.violations)  # type: ignore[union-attr]


def test_with_sigint_ignored_every_keyboard_interrupt_is_the_engines() -> None:
    """A background job starts with SIGINT ignored: no Ctrl-C can reach it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        row = run_target(Target(InterruptingCache.name, "cache", None, InterruptingCache), [0], 10, 20)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert row.first_id == "VALID-INPUT" and "KeyboardInterrupt" in str(row.result.violation)  # type: ignore[union-attr]


class HandlerOfItsOwn(CtrlCCache):
    """An engine that installs a SIGINT handler of its own when built, as servers do;
    then the user presses Ctrl-C."""

    name = "handler-of-its-own"

    def __init__(self) -> None:
        super().__init__()
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def interactive() -> Iterator[None]:
    """SIGINT handled as in an interactive Python process (a test runner started in the
    background inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_an_engine_call_stops_the_campaign(interactive: None) -> None:
    start = time.perf_counter()
    for engine in (CtrlCCache, HandlerOfItsOwn):  # the second: a Ctrl-C that cannot be told from the engine's own
        with pytest.raises(KeyboardInterrupt):
            run_target(Target(engine.name, "cache", None, engine), [0], 10, 20)
    assert time.perf_counter() - start < 5  # stopped at the signal, not after the sleep
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back


ADAPTER = '''
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.mutants import CounterDrift, DoubleUnlock


class TwoBugs(CounterDrift, DoubleUnlock):
    """Its evictable counter drifts, and a second release unlocks the path again."""


class Engine(ReferenceCache):
    name = "two-bugs"
    cache_class = TwoBugs
'''


def test_a_baseline_shows_one_known_and_one_new_finding(tmp_path: Path) -> None:
    (tmp_path / "two_bugs.py").write_text(ADAPTER)
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           f"{tmp_path}/two_bugs.py:Engine", "--seeds", "2", "--expect", "INV-COUNTERS",
                           "--repro-dir", str(tmp_path / "repro")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "known: INV-COUNTERS in" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("two-bugs"))
    assert "INV-REFCOUNT" in row and "INV-COUNTERS" not in row
    # the new finding's reproduction loads the engine's class from the adapter's file
    assert "fails standalone with AssertionError: INV-REFCOUNT" in done.stdout, done.stdout


def test_a_raising_adapter_is_reported_by_the_cli_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "raising.py").write_text(
        "from kvoracle.oracle.engines.reference_cache import ReferenceCache\n\n\n"
        "class Engine(ReferenceCache):\n    name = 'raising'\n\n"
        "    def evict_gpu(self, n):\n        raise MemoryError('engine fell over')\n")
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           f"{tmp_path}/raising.py:Engine", "--seeds", "1", "--repro-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "LIVE-EVICT" in done.stdout and "engine fell over" in done.stdout


def test_an_adapters_drawn_faults_print_as_its_campaign_drew_them(tmp_path: Path) -> None:
    """An adapter whose engine suffers only hangs: the campaign runs in a process of its
    own, and the program the command line prints names the faults that process drew, as
    the JSON and the reproduction do (it printed them from the full fault model)."""
    (tmp_path / "hanging.py").write_text(
        "from kvoracle.kvcache.faults import FaultKind\n"
        "from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler\n"
        "from kvoracle.oracle.mutants import NoTimeout\n\n\n"
        "class Engine(ReferenceScheduler):\n    name = 'hanging'\n"
        "    fault_kinds = frozenset({FaultKind.HANG})\n    scheduler_class = NoTimeout\n")
    report = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           f"{tmp_path}/hanging.py:Engine", "--seeds", "1", "--examples", "40", "--json", str(report),
                           "--repro-dir", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    [row] = json.loads(report.read_text())
    printed = re.findall(r"^  \d+\. (.*)$", done.stdout, re.M)
    assert printed == row["counterexample"] and any("hang" in step for step in printed), done.stdout
    assert not re.search(r"late|error|partial|raise|twice", " ".join(printed)), printed


class Hanging(ReferenceScheduler):
    """The reference without timeouts, over I/O that can only hang."""

    name = "hanging"
    fault_kinds = frozenset({FaultKind.HANG})
    scheduler_class = NoTimeout


def test_a_program_reads_as_the_process_that_drew_it_rendered_it() -> None:
    """The counterexample's faults are named by the campaign's own process, so a printer
    that draws from another fault pool (the parent of a worker) prints what was drawn."""
    target = Target("hanging", "scheduler", None, Hanging)
    cli.use_target_faults(target)
    try:
        result = run_machine(target.machine(), seed_value=0, examples=40, steps=100)
    finally:
        use_faults(None)  # the full fault model, as a parent that never set this target's
    assert not result.passed and result.shown, "the hanging engine's LIVE-TRANSFER was not found"
    assert shown(result) == result.shown and any("hang" in step for step in result.shown)
    assert not re.search(r"late|error|partial|raise|twice", " ".join(result.shown))
    assert tuple(map(readable, result.counterexample)) != result.shown  # what this process would have printed


DRIFTING = '''
from dataclasses import replace

from kvoracle.oracle.engines.reference_cache import ReferenceCache


class Drifting(ReferenceCache):
    """Its abstraction miscounts transfers once two requests are live (an adapter bug
    only refinement sees: every invariant still holds)."""

    name = "drifting"

    def abstract(self):
        s = super().abstract()
        return replace(s, next_transfer=s.next_transfer + 1) if len(s.requests) > 1 else s
'''


def test_a_refinement_finding_reproduces_against_the_checkers_record(tmp_path: Path) -> None:
    (tmp_path / "drifting.py").write_text(DRIFTING)
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           f"{tmp_path}/drifting.py:Drifting", "--seeds", "1", "--repro-dir", str(tmp_path / "repro")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 1 and "REFINEMENT" in done.stdout, done.stdout + done.stderr
    assert "fails standalone with AssertionError: REFINEMENT" in done.stdout, done.stdout
    (path,) = (tmp_path / "repro").glob("drifting_*_refinement.py")
    fixed = path.read_text().replace(f"{tmp_path}/drifting.py:Drifting",
                                     "kvoracle.oracle.engines.reference_cache:ReferenceCache")
    (tmp_path / "fixed.py").write_text(fixed)
    assert run_reproduction(tmp_path / "fixed.py") == ""  # the engine agrees with spec: only the adapter drifted


def test_a_seed_draws_the_same_programs_whatever_modules_are_loaded(tmp_path: Path) -> None:
    """Hypothesis draws, now and then, constants it reads from loaded local modules; a
    campaign draws from its seed alone, so a checkout, the wheel and a test session with
    other modules loaded run the same programs."""

    def programs() -> tuple[int, dict[str, int], dict[str, int]]:
        tally = Tally()
        machine = type("Counted", (Target("reference", "scheduler", None).machine(),), {"tally": tally})
        assert run_machine(machine, seed_value=0, examples=30, steps=100).passed
        return tally.steps, tally.per_rule, tally.outcomes

    before = programs()
    planted = tmp_path / "kvoracle_planted_constants.py"  # a local module full of constants of every kind
    planted.write_text("\n".join(f"I{k} = {7 ** k}\nF{k} = {k / 7!r}\nS{k} = 's{k}'\nB{k} = b'b{k}'"
                                 for k in range(3, 40)) + "\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module(planted.stem)
        assert programs() == before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(planted.stem, None)


def test_the_command_line_runs_under_a_fixed_hash_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unless PYTHONHASHSEED is set, `kvoracle` starts again under 0: an engine that orders
    sets of strings by hash then runs the same way in every campaign and reproduction."""
    started: list[tuple[list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append((argv, env))
        raise SystemExit(0)

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.setattr(sys, "argv", ["kvoracle", "mutants"])
    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        cli.main()
    assert started == [([sys.executable, "-m", "kvoracle.oracle.cli", "mutants"], {**os.environ, "PYTHONHASHSEED": "0"})]
    monkeypatch.setenv("PYTHONHASHSEED", "3")
    assert cli.main() == 0 and len(started) == 1  # a seed the user set is kept


def test_a_reproduction_replays_under_the_hash_seed_of_its_campaign(tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(with_hash_seed("# kvoracle reproduction: x, INV-PIN\nimport os\n"
                                     "print(os.environ.get('PYTHONHASHSEED'), hash('kv'))\n", "5"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}

    def run(*argv: str, **extra: str) -> str:
        return subprocess.run([sys.executable, *argv], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout

    assert run(str(script)) == run(str(script), PYTHONHASHSEED="9") and run(str(script)).startswith("5 ")
    assert run("-c", f"exec(open({str(script)!r}).read())", PYTHONHASHSEED="9").startswith("9 ")  # exec'd: as it is
    assert "random hash seed" in with_hash_seed("# kvoracle reproduction: x, INV-PIN\n", "")


def test_a_reproduction_failure_is_read_through_an_engines_rank_prefix(tmp_path: Path) -> None:
    """SGLang's logger prefixes every line of stderr with its rank: the failure is still
    the assertion, so the reproduction confirms its ID."""
    script = tmp_path / "repro.py"
    script.write_text("import sys\n"
                      "sys.stderr.write('[rank0]: Traceback (most recent call last):\\n')\n"
                      "sys.stderr.write('[rank0]: AssertionError: INV-CONSERVE: CPU blocks [5] are on the free list twice\\n')\n"
                      "sys.stderr.write('[rank0]:   INV-CONSERVE: CPU block 5 is owned by the free list, the free list\\n')\n"
                      "sys.exit(1)\n")
    assert run_reproduction(script) == "AssertionError: INV-CONSERVE: CPU blocks [5] are on the free list twice"


# Two planted bugs a machine reports as REFINEMENT on the call that made them; each class
# is loaded from its own file, so that a reproduction's preamble loads it from there too.
PLANTED = '''
from kvoracle.kvcache.manager import CacheManager
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.actions import Complete
from kvoracle.spec.types import succeeded


class OverdrawnMatch(CacheManager):
    """The eighth blind run's: match's limit bounds the swap-in and the prefetch each,
    not the two together, so the two take more GPU blocks than the caller allowed (a
    step spec refuses)."""

    def match(self, r, hashes, *, limit=None):
        if limit is None:
            return super().match(r, hashes)
        path = self._walk_gpu(hashes)
        swapped = self._cpu_run(path[-1] if path else self.tree.root, hashes[len(path):], limit)
        return super().match(r, hashes, limit=limit + len(swapped))


class GreedyAllocate(CacheManager):
    """The tenth blind run's: allocation as a slice of the free list's tail, which for 0
    blocks is the whole list (a step spec refuses: more blocks than the caller asked)."""

    def allocate(self, r, n):
        return super().allocate(r, n or self.gpu.num_free)


class MisreportedToken(ResourceManager):
    """Reports each decoded token as the other one of the alphabet: the engine's state
    is sound, and only the record of what it did differs."""

    def _decode(self, r):
        super()._decode(r)
        if self.events and type(self.events[-1]).__name__ == "Decode":
            last = self.events[-1]
            self.events[-1] = type(last)(last.request, 3 - last.token, last.blocks)


class UncopiedOrphanSwapIn(ResourceManager):
    """The eleventh blind run's: a swap-in whose request has left lands without its
    bytes being copied (the node turns GPU-resident over whatever its block held)."""

    def _move(self, job, done):
        if type(job).__name__ == "SwapInJob" and job.request is None:
            return done
        return super()._move(job, done)


class FreedBeforeCopied(ResourceManager):
    """The twentieth blind run's: an answer completes its transfer, which gives the source
    blocks back, before the bytes are copied out of them. Harmless here, where the copy
    follows in the same call; on a device whose copies run on their own stream the block
    may be handed out and overwritten first."""

    def _deliver(self, t, outcome):
        job = self.cache.jobs.get(t)
        if job is None:
            return super()._deliver(t, outcome)
        self.cache.complete(t, outcome)  # first: its blocks go back
        arrived = self._move(job, succeeded(outcome, len(job.items)))  # then: their bytes are copied
        self.events.append(Complete(t, outcome))
        self.started.pop(t, None)
        self._reads.pop(t, None)
        if type(job).__name__ in ("SwapInJob", "PrefetchJob") and job.request is not None and arrived < len(job.items):
            self._recompute(job.request, {g for *_, g in job.items[arrived:]})
'''

# A CPU hit, then a stored block, matched with a budget of one block (found by the
# campaign with OverdrawnMatch as a mutant, seed 0, shrunk to these).
OVERDRAWN = ["state.admit(budget=0, chunk=0, cold=0, p=0, prefill=False, then=None)", "state.commit(i=0)",
             "state.release(i=0, write=False)", "state.evict(need=1, then=Ok(), tier='gpu')",
             "state.admit(budget=1, chunk=0, cold=2, p=0, prefill=False, then=None)"]


def test_a_match_over_its_callers_limit_is_no_step_of_spec(tmp_path: Path) -> None:
    (tmp_path / "planted.py").write_text(PLANTED)
    planted = Mutant("overdrawn-match", 3, "", "", frozenset({"REFINEMENT"}),
                     file_module(tmp_path / "planted.py").OverdrawnMatch)
    machine = Target(planted.name, "cache", planted).machine()
    found = replay(machine, OVERDRAWN)
    assert found is not None and found.first_id == "REFINEMENT"
    assert "2 GPU blocks swapped in and prefetched for a limit of 1" in str(found)
    assert replay(Target("reference", "cache", None).machine(), OVERDRAWN) is None
    assert_refinement_reproduces(tmp_path, reproduction(machine, OVERDRAWN, found), "OverdrawnMatch",
                                 "from kvoracle.kvcache.manager import CacheManager as Cache")


def test_an_allocation_of_more_blocks_than_asked_is_no_step_of_spec(tmp_path: Path) -> None:
    """An admission whose prompt is all GPU hits asks for 0 blocks: the planted engine
    takes every free one, which spec's allocate refuses (it knows the count asked)."""
    (tmp_path / "planted.py").write_text(PLANTED)
    planted = Mutant("greedy-allocate", 4, "", "", frozenset({"REFINEMENT"}),
                     file_module(tmp_path / "planted.py").GreedyAllocate)
    result = run_machine(Target(planted.name, "cache", planted).machine(), seed_value=0, examples=50, steps=30)
    assert result.first_id == "REFINEMENT" and "blocks given for 0 asked" in str(result.violation), result.violation


def test_a_misreported_step_reproduces_against_the_record_before_it(tmp_path: Path) -> None:
    (tmp_path / "planted.py").write_text(PLANTED)
    planted = Mutant("misreported-token", 6, "", "", frozenset({"REFINEMENT"}),
                     scheduler_class=file_module(tmp_path / "planted.py").MisreportedToken)
    machine = Target(planted.name, "scheduler", planted).machine()
    result = run_machine(machine, seed_value=0, examples=50, steps=30)
    assert result.first_id == "REFINEMENT" and result.violation is not None, result.violation
    text = reproduction(machine, result.counterexample, result.violation)
    assert_refinement_reproduces(tmp_path, text, "MisreportedToken",
                                 "from kvoracle.scheduler.resource_manager import ResourceManager as Scheduler")


# A prompt cached, evicted to the CPU tier, matched again by a second request whose
# swap-in answers late (fault 509: LATE 2 on the copy), which is aborted before it lands
# (found by the campaign, seed 8, with UncopiedOrphanSwapIn as a mutant, shrunk to these).
ORPHANED = ["state.submit(p=0, tail=0)", "state.schedule(f=())", "state.schedule(f=())", "state.abort(f=(), i=0)",
            "state.submit(p=0, tail=0)", "state.tick(n=1, pressure=0)", "state.schedule(f=_faults(509))",
            "state.abort(f=(), i=0)"]


def test_a_block_given_back_before_its_bytes_are_copied_out_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy reads a block its transfer already freed: only garbage in freed blocks
    (oracle.garbage) shows it, since nothing reuses the block within the call."""
    (tmp_path / "planted.py").write_text(PLANTED)
    planted = Mutant("freed-before-copied", 7, "", "", frozenset({"INV-CONTENT"}),
                     scheduler_class=file_module(tmp_path / "planted.py").FreedBeforeCopied)
    result = run_machine(Target(planted.name, "scheduler", planted).machine(), seed_value=0, examples=50, steps=30)
    assert result.first_id == "INV-CONTENT", result.violation
    monkeypatch.setattr(garbage, "_garbage_when_freed", lambda allocator, pool: None)
    assert replay(Target(planted.name, "scheduler", planted).machine(), result.counterexample) is None


def test_a_swap_in_landing_for_a_request_that_left_must_copy_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block the swap-in lands in is the one the prefix was evicted from, and a free
    block keeps its bytes: only garbage in fresh blocks (oracle.garbage) shows the copy
    that never ran."""
    (tmp_path / "planted.py").write_text(PLANTED)
    planted = Mutant("uncopied-orphan", 9, "", "", frozenset({"INV-CONTENT"}),
                     scheduler_class=file_module(tmp_path / "planted.py").UncopiedOrphanSwapIn)
    machine = Target(planted.name, "scheduler", planted).machine()
    found = replay(machine, ORPHANED)
    assert found is not None and found.first_id == "INV-CONTENT", found
    assert replay(Target("reference", "scheduler", None).machine(), ORPHANED) is None
    (tmp_path / "buggy.py").write_text(reproduction(machine, ORPHANED, found))
    assert confirms(run_reproduction(tmp_path / "buggy.py"), "INV-CONTENT")
    monkeypatch.setattr(garbage, "garbage_in_fresh_and_freed_blocks", lambda cache, pools: None)
    assert replay(Target(planted.name, "scheduler", planted).machine(), ORPHANED) is None


def assert_refinement_reproduces(tmp_path: Path, text: str, planted: str, reference: str) -> None:
    """The reproduction fails with REFINEMENT on the planted engine and passes once its
    preamble builds the reference instead (the fix): the check judges the last call's
    step again, from the record before it, on whatever engine runs."""
    (tmp_path / "buggy.py").write_text(text)
    assert confirms(run_reproduction(tmp_path / "buggy.py"), "REFINEMENT"), text
    line = re.compile(rf"^from kvoracle\.oracle\.engines import file_module\n(\w+) = file_module\(.*\)\.{planted}$",
                      re.M)
    fixed = line.sub(reference, text)
    assert fixed != text, "the reproduction does not load the planted class"
    (tmp_path / "fixed.py").write_text(fixed)
    assert run_reproduction(tmp_path / "fixed.py") == "", fixed


class RemembersAcrossPrograms(RuleBasedStateMachine):
    """An engine whose state outlives its program: it fails on the 30th call of the campaign,
    whichever program makes it, so the failing program passes when run again."""

    calls = [0]

    @rule()
    def call(self) -> None:
        type(self).calls[0] += 1
        if type(self).calls[0] == 30:
            raise PropertyViolated("call", [Violation("INV-CONSERVE", "block 1 is owned twice")])


@pytest.mark.parametrize("generator", campaign.DRAWERS)
def test_a_failure_that_does_not_replay_still_says_what_it_found_and_why_there_is_no_program(generator: str) -> None:
    RemembersAcrossPrograms.calls[0] = 0
    campaign.set_generator(generator)
    try:
        result = run_machine(RemembersAcrossPrograms, seed_value=0, examples=50, steps=20)
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    assert result.counterexample == ()
    assert not result.passed and result.violation is not None
    assert result.violation.first_id == "INV-CONSERVE"
    message = result.violation.violations[0].message
    assert message.startswith("block 1 is owned twice [no program: the same program behaved otherwise"), message
    assert "keeps state from one program to the next" in message
