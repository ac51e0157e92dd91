"""Campaigns: a target that raises is a finding, not a crash; a baseline turns known
violations into "known" and the campaign goes on to find the new ones."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.findings import run_reproduction
from kvoracle.oracle.targets import Target
from kvoracle.spec.types import Outcome, TransferId

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
    assert [r.verdict for r in rows] == ["FAIL", "FAIL", "pass"]
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
    assert [r.verdict for r in rows] == ["FAIL", "pass"]
    assert rows[0].first_id == "VALID-INPUT" and "SystemExit(3)" in str(rows[0].result.violation)  # type: ignore[union-attr]


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
