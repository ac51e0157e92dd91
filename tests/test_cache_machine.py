"""The reference cache survives the cache-level stateful machine."""

from collections.abc import Sequence

from kvoracle.kvcache.manager import CacheManager, MatchReport
from kvoracle.oracle.cache_machine import CacheMachine
from kvoracle.oracle.campaign import replay, run_machine
from kvoracle.oracle.engine import CACHE_LEVEL
from kvoracle.oracle.engines.reference_cache import ReferenceCache, ReferenceCacheSmallCpu
from kvoracle.oracle.mutants import Mutant
from kvoracle.oracle.targets import Target, tally_of
from kvoracle.spec.actions import Drop, EvictStep
from kvoracle.spec.types import BlockHash, RequestId

TestReferenceCache = CacheMachine.TestCase


class SmallCpuMachine(CacheMachine):
    make_adapter = ReferenceCacheSmallCpu


TestReferenceCacheSmallCpu = SmallCpuMachine.TestCase


def test_the_machine_draws_only_the_outcomes_an_engine_declares() -> None:
    """An engine whose swaps are synchronous declares {"ok"}: no transfer of it fails."""
    class Synchronous(ReferenceCache):
        name = "synchronous"
        transfer_outcomes = frozenset({"ok"})

    runs = {}
    for adapter in (ReferenceCache, Synchronous):
        machine = Target(adapter.name, "cache", None, adapter).machine()
        assert run_machine(machine, seed_value=0, examples=60, steps=60).passed
        runs[adapter.name] = tally_of(machine)
    assert set(runs["synchronous"].outcomes) == {"ok"} and runs["synchronous"].faults == 0
    assert runs["reference"].faults > 0 and set(runs["reference"].outcomes) > {"ok"}  # the same campaign fails some


def test_every_bad_call_of_the_cache_level_is_made() -> None:
    """Each kind the reference refuses is drawn and made, so its refusal path is checked."""
    machine = Target("reference", "cache", None).machine()
    for seed in (0, 1):
        assert run_machine(machine, seed_value=seed, examples=100, steps=60).passed
    made = set(tally_of(machine).per_rule)
    assert {kind.value for kind in CACHE_LEVEL} - made == set()


def test_a_cpu_tier_of_one_block_makes_evictions_drop() -> None:
    """The small-CPU row exists to reach the drop paths: its campaign passes, and its GPU
    evictions drop leaves far more often than the three-block tier's."""
    drops: dict[str, int] = {}

    def counted(base: type[ReferenceCache]) -> type[ReferenceCache]:
        def evict_gpu(self: ReferenceCache, n: int) -> tuple[EvictStep, ...]:
            steps = base.evict_gpu(self, n)
            drops[base.name] = drops.get(base.name, 0) + sum(isinstance(s, Drop) for s in steps)
            return steps
        return type("Counted", (base,), {"evict_gpu": evict_gpu})

    for base in (ReferenceCache, ReferenceCacheSmallCpu):
        machine = Target(base.name, "cache", None, counted(base)).machine()
        assert run_machine(machine, seed_value=0, examples=60, steps=60).passed
    assert drops.get("reference-small-cpu", 0) > 2 * drops.get("reference", 0)


class OverdrawnMatch(CacheManager):
    """A planted bug (the eighth blind run's): match's limit bounds the swap-in and the
    prefetch each, not the two together, so the two take more GPU blocks than allowed."""

    def match(self, r: RequestId, hashes: Sequence[BlockHash], *, limit: int | None = None) -> MatchReport:
        if limit is None:
            return super().match(r, hashes)
        path = self._walk_gpu(hashes)
        swapped = self._cpu_run(path[-1] if path else self.tree.root, hashes[len(path):], limit)
        return super().match(r, hashes, limit=limit + len(swapped))


# A CPU hit, then a stored block, matched with a budget of one block (found by the
# campaign, `kvoracle check` with this class as a mutant: REFINEMENT, shrunk to these).
OVERDRAWN = ["state.admit(budget=0, chunk=0, cold=0, p=2, prefill=False, then=None)", "state.commit(i=0)",
             "state.release(i=0, write=False)", "state.admit(budget=0, chunk=0, cold=2, p=3, prefill=False, then=None)",
             "state.evict(need=1, then=Ok(), tier='gpu')",
             "state.admit(budget=1, chunk=0, cold=0, p=2, prefill=False, then=None)"]


def test_a_match_over_its_callers_limit_is_no_step_of_spec() -> None:
    planted = Mutant("overdrawn-match", 3, "", "", frozenset({"REFINEMENT"}), OverdrawnMatch)
    found = replay(Target(planted.name, "cache", planted).machine(), OVERDRAWN)
    assert found is not None and found.first_id == "REFINEMENT"
    assert "2 GPU blocks swapped in and prefetched for a limit of 1" in str(found)
    assert replay(Target("reference", "cache", None).machine(), OVERDRAWN) is None
