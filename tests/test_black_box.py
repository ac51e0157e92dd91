"""What the adapter Protocols' observations catch on their own.

The reference's adapters with the refinement hook and the engine's own structural
checks switched off are what an engine that exposes only block ids looks like. The
cache and scheduler machines must still kill every mutant, in the same campaign as
tests/test_mutants.py, through `observe` alone (and INV-CONTENT, which reads the KV
bytes), while the reference passes. The ID may differ from the one the full machine
reports first: the heap drop, for one, shows as an evictable block that eviction never
takes (LIVE-EVICT).
Liveness is judged from the machine's own record either way: a transfer that never
ends is LIVE-TRANSFER on the machine's clock, whatever the engine's timers say.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.cli import print_unchecked
from kvoracle.oracle.preflight import preflight
from kvoracle.oracle.engine import Observation
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.mutant_docs import kill
from kvoracle.oracle.mutants import MUTANTS, Mutant
from kvoracle.oracle.targets import Target
from kvoracle.oracle.unchecked import unchecked
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import CacheState, System


class BlackBoxCache(ReferenceCache):
    def abstract(self) -> CacheState | None:
        return None

    def invariants(self) -> list[Violation]:
        return []

    def snapshot(self) -> object:
        return self.observe(), self.observe_cpu()


class BlackBoxScheduler(ReferenceScheduler):
    def state(self) -> System | None:
        return None

    def events(self) -> list[Event] | None:
        return None

    def invariants(self) -> list[Violation]:
        return []

    def snapshot(self) -> object:
        return self.observe(), self.observe_cpu(), self.statuses()


# The first ID each mutant is killed with through observation alone (docs/engines.md
# shows this table next to the IDs its own machine reports first). Which of two
# symptoms shows first can depend on what else the process loaded (Hypothesis draws
# some values from loaded modules' constants), hence "or".
FIRST_ID = {
    "heap-drop": {"LIVE-EVICT"},
    "untracked-parent": {"INV-COUNTERS"},
    "double-free": {"INV-CONSERVE"},
    "double-unlock": {"INV-REFCOUNT", "INV-COUNTERS"},
    "counter-drift": {"INV-COUNTERS"},
    "cross-tier": {"INV-TIER", "INV-CONSERVE"},
    "duplicate-overwrite": {"INV-NO-UAF", "INV-CONSERVE", "LIVE-EXIT"},
    "recycle-listed": {"INV-NO-UAF"},
    "wedged-eviction": {"LIVE-EVICT"},
    "write-raise-finish": {"VALID-INPUT"},
    "write-raise-preempt": {"VALID-INPUT"},
    "write-raise-batch": {"VALID-INPUT"},
    "leaky-admit": {"INV-REQUEST"},
    "no-timeout": {"LIVE-TRANSFER"},
    "late-timeout": {"LIVE-TRANSFER"},
    "stuck-fill": {"REFINEMENT"},
    "starving-admit": {"LIVE-ADMIT"},
    "self-preempt": {"LIVE-PROGRESS"},
    "miscounted-swap": {"VALID-INPUT"},
    "late-free": {"INV-CONSERVE", "INV-NO-UAF"},
    "kept-wrong-size": {"INV-CONTENT"},
    "recycle-listed-content": {"INV-CONTENT"},
}


def black_box(m: Mutant | None, level: str) -> type[RuleBasedStateMachine]:
    target = Target("reference" if m is None else m.name, level, m)
    return target.machine(BlackBoxCache, BlackBoxScheduler)


@pytest.mark.parametrize("level", ["cache", "scheduler"])
def test_reference_passes_black_box(level: str) -> None:
    result = run_machine(black_box(None, level), seed_value=0, examples=200, steps=100)
    assert result.passed, str(result.violation)


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.observable], ids=lambda m: m.name)
def test_mutant_killed_through_observation(mutant: Mutant) -> None:
    """The same campaign as tests/test_mutants.py, on the black-box adapter."""
    result = kill(mutant, black_box(mutant, mutant.level))
    assert not result.passed, f"{mutant.name} survived the black-box {mutant.level} machine"
    # the documented ID, or (as the draw may differ between processes) one its bug breaks
    assert result.first_id in FIRST_ID[mutant.name] | mutant.kills, f"{mutant.name}: {result.violation}"


def test_a_mutant_left_out_here_is_one_only_refinement_kills_which_a_black_box_leaves_unchecked() -> None:
    """A transfer timed out early is a step the engine reports and spec refuses; its
    observations (block ids, transfers in flight) are those of one answered early."""
    hidden = [m for m in MUTANTS if not m.observable]
    assert hidden and all(m.kills == {"REFINEMENT"} for m in hidden), hidden
    assert unchecked(BlackBoxScheduler())[0].startswith("REFINEMENT")
    for m in hidden:  # it is so: the campaign that kills it with the hooks passes without them
        result = kill(m, black_box(m, m.level))
        assert result.passed, f"{m.name} is killed through observation ({result.violation}): mark it observable"


def test_docs_show_the_black_box_ids() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text(encoding="utf-8")
    rows = {cells[0]: cells[2] for line in doc.splitlines()
            if len(cells := [c.strip() for c in line.strip("|").split("|")]) == 3 and cells[0] in FIRST_ID}
    assert {m: set(ids.split(" (")[0].split(" or ")) for m, ids in rows.items()} == FIRST_ID
    assert all(m.name in FIRST_ID or f"| {m.name} | REFINEMENT | not killed:" in doc for m in MUTANTS)


def test_a_campaign_says_what_it_could_not_check() -> None:
    """With the hooks off, refinement and the clauses that need the full state are named
    as unchecked; the reference adapters, which give the abstraction, leave nothing out."""
    assert unchecked(ReferenceCache()) == [] and unchecked(ReferenceScheduler()) == []
    gaps = unchecked(BlackBoxCache())
    assert gaps[0].startswith("REFINEMENT, INV-TREE") and "abstract() or state() gives None" in gaps[0]
    assert any(g.startswith("INV-HEAP-SOUND on the tree's nodes: no `nodes`") for g in gaps)
    assert not any(g.startswith(("INV-CONSERVE", "INV-REFCOUNT")) for g in gaps)  # the observation gives those


def test_an_adapter_that_cannot_be_observed_alone_leaves_the_report_standing(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Its campaign has failed already (VALID-INPUT names the call); listing what it leaves
    unchecked must not end `kvoracle check` with a traceback."""
    class MovedApi(BlackBoxCache):
        def observe_cpu(self) -> Observation:
            raise AttributeError("'CPUOffloadingManager' object has no attribute '_num_write_pending_blocks'")

    print_unchecked(preflight(MovedApi).gaps)
    out = capsys.readouterr().out
    assert out.startswith("not checked: unknown: MovedApi could not be built and observed alone (AttributeError: ")
