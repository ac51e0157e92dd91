"""The checkers themselves, fed deliberately broken inputs: each corruption of the reference
cache must be reported under the property it breaks (kvcache/abstraction.py), each
corrupted KV block under INV-CONTENT (scheduler/content.py), and the fault injectors
(kvcache/faults.py) must give exactly the faults and answers they document.

A checker that only ever sees sane states can be switched off without a test noticing;
these tests are what notices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

import pytest

from kvoracle.kvcache.abstraction import audit, check_invariants, view
from kvoracle.kvcache.faults import (
    Answer,
    Fault,
    FaultKind,
    FaultyCopier,
    FaultyStorage,
    NoFaults,
    OK_FAULT,
    Reply,
    ScriptedFaults,
    SwapError,
)
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool import make_pool
from kvoracle.kvcache.pool.fingerprint import content_fingerprints, seed_content, seed_fingerprints
from kvoracle.kvcache.storage import MemoryStorage, StorageError
from kvoracle.kvcache.tree import Node
from kvoracle.scheduler.content import KVPools, content
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation
from kvoracle.spec.types import BlockHash, CpuBlock, Error, GpuBlock, Ok, OnCpu, OnGpu, Partial, RequestId, SwappingOut

R0, R1, R2 = RequestId(0), RequestId(1), RequestId(2)
HS = block_hashes([1, 1, 2, 2], 2)  # two chained full blocks
LEAF = block_hashes([3, 3], 2)[0]  # an unrelated one-block prefix


def ids(found: Iterable[Violation]) -> list[str]:
    return [v.id for v in found]


def node(cache: CacheManager, h: BlockHash) -> Node:
    return next(n for n in cache.tree.walk() if n.hash == h)


def live_path() -> CacheManager:
    """R0 is live and holds the path HS[0] <- HS[1] (refcount 1: no heap entries); the state is sane."""
    cache = CacheManager(4, 2)
    cache.match(R0, HS)
    cache.allocate(R0, 2)
    assert cache.commit(R0, HS) == 2
    assert check_invariants(cache) == []
    return cache


def with_a_swap_in_flight() -> CacheManager:
    """live_path(), plus an unrelated leaf cached by another request and now swapping out."""
    cache = live_path()
    cache.match(R1, [LEAF])
    cache.allocate(R1, 1)
    cache.commit(R1, [LEAF])
    cache.release(R1)
    rep = cache.evict_gpu(1)
    assert rep.swap_out is not None and cache.in_flight() == [rep.swap_out]
    assert check_invariants(cache) == []
    return cache


# --- audit / check_invariants on broken caches -----------------------------------------------------


def test_a_dead_node_still_linked_is_inv_tree() -> None:
    """A node marked removed but still linked in the tree is an INV-TREE violation."""
    cache = live_path()
    node(cache, HS[1]).alive = False
    assert ids(audit(cache)) == ["INV-TREE"]
    assert ids(check_invariants(cache)) == ["INV-TREE"]


def test_a_node_filed_under_another_key_is_inv_tree() -> None:
    """A child its parent files under another hash is an INV-TREE violation."""
    cache = live_path()
    a = node(cache, HS[0])
    b = a.children.pop(HS[1])
    a.children[BlockHash(12345)] = b
    found = audit(cache)
    assert found and set(ids(found)) == {"INV-TREE"}
    assert set(ids(check_invariants(cache))) == {"INV-TREE"}


def test_a_wrong_gpu_child_count_is_inv_counters() -> None:
    """A node whose kept GPU-child count disagrees with its children is an INV-COUNTERS violation."""
    cache = live_path()
    node(cache, HS[0]).gpu_children += 1
    assert ids(audit(cache)) == ["INV-COUNTERS"]
    found = check_invariants(cache)
    assert ids(found) == ["INV-COUNTERS"] and "GPU children" in found[0].message


@pytest.mark.parametrize("setup", [live_path, with_a_swap_in_flight], ids=["quiet", "swap-in-flight"])
def test_a_detached_node_on_a_live_path_is_inv_tree(setup: object) -> None:
    """A node a live request's path holds, unlinked from its parent, is an INV-TREE violation (and nothing else)."""
    cache = setup()  # type: ignore[operator]
    assert isinstance(cache, CacheManager)
    del cache.tree.root.children[HS[0]]  # the path HS[0] <- HS[1] leaves the tree
    found = audit(cache)
    assert ids(found) == ["INV-TREE"] and "detached" in found[0].message
    assert ids(check_invariants(cache)) == ["INV-TREE"]


@pytest.mark.parametrize("tier", ["gpu", "cpu"])
def test_an_in_use_block_on_the_free_list_is_inv_conserve(tier: str) -> None:
    """A block on a free list whose bitmap says it is in use is an INV-CONSERVE violation."""
    cache = with_a_swap_in_flight()  # GPU blocks of R0's path and CPU block of the swap-out are in use
    if tier == "gpu":
        g = next(b for b in range(cache.gpu.size) if not cache.gpu.is_free(b))
        cache.gpu._free.append(GpuBlock(g))
    else:
        c = next(b for b in range(cache.cpu.size) if not cache.cpu.is_free(b))
        cache.cpu._free.append(CpuBlock(c))
    assert ids(audit(cache)) == ["INV-CONSERVE"]
    assert "INV-CONSERVE" in ids(check_invariants(cache))


def test_a_free_block_twice_on_the_free_list_is_inv_conserve() -> None:
    """A free list holding one block twice is an INV-CONSERVE violation."""
    cache = live_path()
    g = next(b for b in range(cache.gpu.size) if cache.gpu.is_free(b))
    cache.gpu._free.append(GpuBlock(g))
    assert "INV-CONSERVE" in ids(check_invariants(cache))


@pytest.mark.parametrize("counter", ["gpu_evictable", "cpu_evictable"])
def test_a_drifted_counter_on_an_intact_tree_is_inv_counters(counter: str) -> None:
    """A kept evictable counter that disagrees with the structures is an INV-COUNTERS violation naming it."""
    cache = with_a_swap_in_flight()
    setattr(cache, counter, getattr(cache, counter) + 1)
    assert audit(cache) == []  # the tree is intact: only spec/'s recount can see it
    found = check_invariants(cache)
    assert ids(found) == ["INV-COUNTERS"] and found[0].message.startswith(counter)
    tier = view(cache).gpu if counter.startswith("gpu") else view(cache).cpu
    assert tier is not None and tier.counters is not None
    got, real = tier.counters[counter]
    assert got == real + 1


def test_audit_and_spec_findings_are_both_reported() -> None:
    """check_invariants reports the implementation audit's findings and spec/'s together."""
    cache = live_path()
    node(cache, HS[0]).gpu_children += 1  # seen by audit only
    cache.gpu_evictable += 1  # seen by spec/ only
    found = check_invariants(cache)
    assert ids(found) == ["INV-COUNTERS", "INV-COUNTERS"]
    assert any("GPU children" in v.message for v in found) and any(v.message.startswith("gpu_evictable") for v in found)


# --- content() on corrupted bytes ------------------------------------------------------------------


def rm_with_pools(gpu: int = 6, cpu: int = 2, block_size: int = 2, copier: FaultyCopier | None = None) -> ResourceManager:
    pools = KVPools(make_pool("numpy", "cpu", gpu, block_size, 1, 8), make_pool("numpy", "cpu", cpu, block_size, 1, 8))
    return ResourceManager(CacheManager(gpu, cpu), FaultyStorage(MemoryStorage(), NoFaults()),
                           copier or FaultyCopier(NoFaults()), block_size=block_size, write_policy=WritePolicy.NONE,
                           pools=pools)


def kv_content(rm: ResourceManager) -> list[Violation]:
    assert rm.pools is not None
    ready = [r for r in rm.running if rm.cache.ready(r)]
    return content(rm.cache, rm.pools, {r: (list(rm.cache.table(r)), rm.seeds(r)) for r in ready})


def pools(rm: ResourceManager) -> KVPools:
    assert rm.pools is not None
    return rm.pools


def scribble(rm: ResourceManager, tier: str, block: int) -> None:
    """Overwrite one block's bytes with zeros."""
    pool = pools(rm).gpu if tier == "gpu" else pools(rm).cpu
    pool.write([block], [bytes(pool.block_bytes)])


def cached(rm: ResourceManager) -> None:
    """R0 computes [1, 1, 2, 2], commits it and finishes: two cached GPU nodes no request lists."""
    rm.submit(R0, [1, 1, 2, 2])
    rm.schedule()
    rm.schedule()
    rm.finish([R0])
    assert kv_content(rm) == []


T = TypeVar("T")


def evicted(rm: ResourceManager, kind: type[T]) -> T:
    """R0's cached blocks after one round of eviction: the tier of the first node that is
    now `kind`, every block's bytes still its prefix's."""
    cached(rm)
    rm.evict_all()
    tiers = [n.tier for n in rm.cache.tree.walk() if isinstance(n.tier, kind)]
    assert tiers and kv_content(rm) == []
    return tiers[0]


def test_content_flags_a_corrupted_cached_gpu_block() -> None:
    """A cached GPU block whose bytes are not its prefix's is INV-CONTENT, even when no request lists it."""
    rm = rm_with_pools()
    cached(rm)
    t = node(rm.cache, HS[0]).tier
    assert isinstance(t, OnGpu)
    scribble(rm, "gpu", t.gpu)
    assert ids(kv_content(rm)) == ["INV-CONTENT"]


def test_content_reports_a_corrupted_block_once_though_the_tree_and_a_table_reach_it() -> None:
    rm = rm_with_pools()
    cached(rm)
    rm.submit(R1, [1, 1, 2, 2, 3])  # its table starts with the two cached blocks
    rm.schedule()
    t = node(rm.cache, HS[0]).tier
    assert isinstance(t, OnGpu) and t.gpu in rm.cache.table(R1) and kv_content(rm) == []
    scribble(rm, "gpu", t.gpu)
    found = kv_content(rm)
    assert ids(found) == ["INV-CONTENT"] and f"GPU block {t.gpu} " in found[0].message


def test_content_flags_a_corrupted_cpu_copy() -> None:
    """The CPU copy of a node on the CPU tier is checked: wrong bytes there are INV-CONTENT."""
    rm = rm_with_pools()
    t = evicted(rm, OnCpu)
    scribble(rm, "cpu", t.cpu)
    assert ids(kv_content(rm)) == ["INV-CONTENT"]


def test_content_flags_a_corrupted_gpu_block_while_its_node_swaps_out() -> None:
    """A node swapping out still has its GPU copy, which the copy reads: wrong bytes there
    are INV-CONTENT before the swap-out ends (the twenty-sixth blind run's escape checked
    OnGpu only, and a swap-out that then fails leaves the wrong bytes on the GPU)."""
    plan = ScriptedFaults([Fault(FaultKind.HANG)])  # the swap-out is started and never answered
    rm = rm_with_pools(copier=FaultyCopier(plan))
    t = evicted(rm, SwappingOut)
    scribble(rm, "gpu", t.gpu)
    found = kv_content(rm)
    assert ids(found) == ["INV-CONTENT"] and f"GPU block {t.gpu} " in found[0].message


def test_content_flags_a_corrupted_private_block() -> None:
    """A private block listed in a ready request's table is checked against its prefix."""
    rm = rm_with_pools()
    rm.submit(R1, [5, 5, 6])
    assert rm.schedule() == [R1]
    assert kv_content(rm) == []
    scribble(rm, "gpu", rm.cache.table(R1)[-1])
    found = kv_content(rm)
    assert found and set(ids(found)) == {"INV-CONTENT"}


def test_content_tells_partial_blocks_with_equal_tails_but_other_prefixes_apart() -> None:
    """A partial last block holding another prefix's bytes is INV-CONTENT, even when its own tokens are the same."""
    rm = rm_with_pools()
    rm.submit(R1, [1, 1, 5])
    rm.submit(R2, [2, 2, 5])
    assert rm.schedule() == [R1, R2]
    assert kv_content(rm) == []
    p = pools(rm).gpu
    g1, g2 = rm.cache.table(R1)[-1], rm.cache.table(R2)[-1]
    p.write([g2], [p.read(g1)])  # R2's tail block now holds R1's ([1, 1] then [5])
    found = kv_content(rm)
    assert found and set(ids(found)) == {"INV-CONTENT"}


def test_the_expected_fingerprints_survive_their_memo_filling_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that overflows the memo of expected fingerprints still answers every seed it asks."""
    from kvoracle.scheduler import content as module
    monkeypatch.setattr(module, "_WANTED", {})
    monkeypatch.setattr(module, "_WANTED_MAX", 3)
    assert module._wanted([1, 2], 64) == seed_fingerprints([1, 2], 64)
    assert module._wanted([1, 2, 3, 4], 64) == seed_fingerprints([1, 2, 3, 4], 64)
    assert module._wanted([5, 1, 5], 64) == seed_fingerprints([5, 1, 5], 64)


def test_the_fingerprints_of_contents_seen_before_are_those_of_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """INV-CONTENT fingerprints each content once: the memo answers as content_fingerprints
    does on the same bytes, whether it fills up, overflows, or one batch is more than it holds."""
    from kvoracle.scheduler import content as module
    rows = seed_content([1, 2, 3, 1, 4, 5], 64)
    monkeypatch.setattr(module, "_SEEN", {})
    monkeypatch.setattr(module, "_SEEN_BYTES", 3 * 64)
    for batch in (rows[:2], rows[:4], rows[3:], rows[[0, 0]], rows):
        assert module._fingerprints(batch) == content_fingerprints(batch)
    assert len(module._SEEN) <= 3
    changed = rows[:1].copy()
    changed[0, 5] ^= 1
    assert module._fingerprints(changed) == content_fingerprints(changed) != module._fingerprints(rows[:1])


def test_content_flags_a_partial_block_not_refilled_after_decode() -> None:
    """After a decode the partial last block must hold the new token too: its old bytes are INV-CONTENT."""
    rm = rm_with_pools(block_size=4)
    rm.submit(R1, [1, 1, 1, 1, 5])
    assert rm.schedule() == [R1]
    p = pools(rm).gpu
    last = rm.cache.table(R1)[-1]
    old = p.read(last)
    rm.schedule()  # decodes a 6th token into the same last block, which stays partial
    assert len(rm.requests[R1].tokens) == 6 and rm.cache.table(R1)[-1] == last
    assert kv_content(rm) == []
    p.write([last], [old])
    found = kv_content(rm)
    assert found and set(ids(found)) == {"INV-CONTENT"}


# --- fault injectors ---------------------------------------------------------------------------------


class Recording:
    """A fault plan that records what it is asked and gives the scripted faults."""

    def __init__(self, *faults: Fault) -> None:
        self.calls: list[tuple[str, int]] = []
        self._script = ScriptedFaults(faults)

    def next_fault(self, op: str, items: int) -> Fault:
        self.calls.append((op, items))
        return self._script.next_fault(op, items)


def test_fault_refuses_a_negative_done_or_delay() -> None:
    """A fault with a negative done or a negative delay, either alone, is refused with ValueError."""
    with pytest.raises(ValueError):
        Fault(FaultKind.PARTIAL, done=-1, delay=0)
    with pytest.raises(ValueError):
        Fault(FaultKind.LATE, done=0, delay=-1)


def test_injecting_leaves_no_fault_behind_even_when_the_block_raises() -> None:
    """Faults not used up inside `injecting` are dropped on the way out, by a raise too."""
    plan = ScriptedFaults([])
    with pytest.raises(RuntimeError), plan.injecting([Fault(FaultKind.RAISE), Fault(FaultKind.RAISE)]):
        assert plan.next_fault("write", 1).kind is FaultKind.RAISE
        raise RuntimeError("the engine call fails")
    assert plan.next_fault("write", 1) == OK_FAULT
    with plan.injecting([Fault(FaultKind.RAISE)]):
        pass
    assert plan.next_fault("read", 1) == OK_FAULT


def test_faulty_storage_tells_the_plan_each_op_and_batch_size() -> None:
    """FaultyStorage asks its plan with the op ("write" or "read") and the batch size of each call."""
    plan = Recording()
    fs = FaultyStorage(MemoryStorage(), plan)
    blocks = [(BlockHash(i + 1), b"x") for i in range(3)]
    fs.write(blocks)
    fs.read([BlockHash(1), BlockHash(2)])
    assert plan.calls == [("write", 3), ("read", 2)]


def test_faulty_storage_empty_batches() -> None:
    """Empty batches are answered ok with no data, and a raise on one is still a StorageError."""
    fs = FaultyStorage(MemoryStorage(), NoFaults())
    assert fs.write([]) == (Answer(0, Ok()),)
    assert fs.read([]) == ((Answer(0, Ok()),), [])
    raising = FaultyStorage(MemoryStorage(), ScriptedFaults([Fault(FaultKind.RAISE), Fault(FaultKind.RAISE)]))
    with pytest.raises(StorageError, match="empty batch"):
        raising.write([])
    with pytest.raises(StorageError, match="empty batch"):
        raising.read([])


COPY_CASES: list[tuple[Fault, Reply]] = [
    (Fault(FaultKind.OK), (Answer(0, Ok()),)),
    (Fault(FaultKind.ERROR), (Answer(0, Error()),)),
    (Fault(FaultKind.PARTIAL, done=1), (Answer(0, Partial(1)),)),
    (Fault(FaultKind.PARTIAL, done=0), (Answer(0, Partial(0)),)),
    (Fault(FaultKind.HANG), ()),
    (Fault(FaultKind.LATE, delay=3), (Answer(3, Ok()),)),
    (Fault(FaultKind.TWICE, delay=2), (Answer(0, Ok()), Answer(2, Ok()))),
]


@pytest.mark.parametrize(("fault", "reply"), COPY_CASES, ids=[str(c[0]) for c in COPY_CASES])
def test_faulty_copier_answers(fault: Fault, reply: Reply) -> None:
    """Each fault kind gives the documented answers to a swap copy of 2 blocks."""
    copier = FaultyCopier(ScriptedFaults([fault]))
    assert copier.copy("swap_out", 2) == reply
    assert copier.copy("swap_out", 2) == (Answer(0, Ok()),)  # the script is spent


def test_faulty_copier_raise_is_a_swap_error() -> None:
    """A raise fault makes the copy raise SwapError."""
    with pytest.raises(SwapError):
        FaultyCopier(ScriptedFaults([Fault(FaultKind.RAISE)])).copy("swap_in", 2)


def test_faulty_copier_tells_the_plan_each_op_and_batch_size() -> None:
    """FaultyCopier asks its plan with the op and the number of blocks of each copy."""
    plan = Recording()
    copier = FaultyCopier(plan)
    copier.copy("swap_out", 2)
    copier.copy("swap_in", 3)
    assert plan.calls == [("swap_out", 2), ("swap_in", 3)]


def test_faulty_copier_counts_injected_faults() -> None:
    """`injected` counts each non-OK fault the copier was given, by kind."""
    kinds = [FaultKind.ERROR, FaultKind.OK, FaultKind.HANG, FaultKind.ERROR]
    copier = FaultyCopier(ScriptedFaults([Fault(k) for k in kinds]))
    for _ in kinds:
        copier.copy("swap_out", 1)
    assert copier.injected == Counter({FaultKind.ERROR: 2, FaultKind.HANG: 1})


def test_resource_manager_swap_copies_under_reference_op_labels() -> None:
    """The reference labels its swap copies "swap_out" and "swap_in" (the labels a targeting plan matches)."""
    plan = Recording()
    rm = ResourceManager(CacheManager(4, 2), FaultyStorage(MemoryStorage(), plan), FaultyCopier(plan),
                         block_size=2, write_policy=WritePolicy.NONE)
    rm.submit(R0, [1, 1, 2])
    rm.schedule()
    rm.schedule()
    rm.finish([R0])  # one cached node
    rm.evict_all()  # swapped out to the CPU tier
    rm.submit(R1, [1, 1, 2])
    rm.schedule()  # its CPU hit is swapped in
    assert [op for op, _ in plan.calls] == ["swap_out", "swap_in"]
