"""The reference cache survives the cache-level stateful machine."""

import pytest

from kvoracle.kvcache.manager import CacheManager, Completion
from kvoracle.kvcache.transfers import SwapInJob
from kvoracle.oracle.cache_machine import CacheMachine
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.engine import CACHE_LEVEL
from kvoracle.oracle.engines.reference_cache import ReferenceCache, ReferenceCacheSmallCpu
from kvoracle.oracle.targets import Target, tally_of
from kvoracle.spec.actions import Drop, EvictStep
from kvoracle.spec.types import Outcome, TransferId

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


def test_prompts_come_back_so_that_swap_ins_end_in_every_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """An admission under pressure that ends its swap-outs (`cold` 2) re-admits the request
    released last, so its prefix comes back from the CPU tier: swap-ins end in every
    outcome, and several fail for a request still waiting (its table keeps the failed
    blocks as private ones and its path is cut). With uniform prompts the same 150
    programs ended 16 swap-ins, 4 of them failed (41 and 13 now)."""
    outcomes: list[str] = []
    failed = 0
    complete, finish = CacheManager.complete, CacheManager._finish_swap_in

    def counted(self: CacheManager, t: TransferId, outcome: Outcome) -> Completion:
        if isinstance(self.jobs.get(t), SwapInJob):
            outcomes.append(type(outcome).__name__)
        return complete(self, t, outcome)

    def finished(self: CacheManager, job: SwapInJob, done: int) -> None:
        nonlocal failed
        failed += job.request is not None and done < len(job.items)
        finish(self, job, done)

    monkeypatch.setattr(CacheManager, "complete", counted)
    monkeypatch.setattr(CacheManager, "_finish_swap_in", finished)
    assert run_machine(Target("reference", "cache", None).machine(), seed_value=0, examples=150, steps=100).passed
    assert set(outcomes) == {"Ok", "Partial", "Error", "Timeout"}, outcomes
    assert failed >= 8, (failed, outcomes)
