"""Unit tests of the reference cache: allocator, LRU heap, CacheManager scenarios, refinement."""

from __future__ import annotations

from typing import Callable, TypeVar

import pytest

from kvoracle.kvcache.abstraction import abstract, check_invariants, view
from kvoracle.kvcache.allocator import BlockAllocator
from kvoracle.kvcache.errors import (
    BlockOutOfRange,
    DoubleFree,
    DuplicateRequest,
    HashMismatch,
    InvalidLimit,
    InvalidOutcome,
    KVCacheError,
    NotQuiescent,
    NotReady,
    OutOfBlocks,
    UnknownRequest,
    UnknownTransfer,
)
from kvoracle.kvcache.lru import LeafHeap
from kvoracle.kvcache.manager import CacheManager, MatchReport
from kvoracle.kvcache.tree import GPU, Node, RadixTree
from kvoracle.spec import actions
from kvoracle.spec.actions import Drop, EvictCpu, EvictStep, SkipStale, SwapOutTo
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    Error,
    GpuBlock,
    Ok,
    OnCpu,
    OnGpu,
    Outcome,
    Partial,
    RequestId,
    SwappingIn,
    SwappingOut,
    TransferId,
)

T = TypeVar("T")
G, C = GpuBlock, CpuBlock
R0, R1, R2 = RequestId(0), RequestId(1), RequestId(2)
HS = block_hashes([1, 1, 2, 2, 3, 3], 2)  # three chained full blocks


def evicted(steps: tuple[EvictStep, ...]) -> tuple[EvictStep, ...]:
    """The steps that evict something (stale entries popped on the way are the heap's own business)."""
    return tuple(s for s in steps if not isinstance(s, SkipStale))


def ok(cache: CacheManager) -> None:
    assert check_invariants(cache) == []


def node(cache: CacheManager, h: BlockHash) -> Node:
    return next(n for n in cache.tree.walk() if n.hash == h)


def cached(gpu: int = 4, cpu: int = 2, n: int = 2) -> CacheManager:
    """R0 computed HS[:n], committed them and left: n GPU nodes at refcount 0."""
    cache = CacheManager(gpu, cpu)
    cache.match(R0, HS[:n])
    cache.allocate(R0, n)
    assert cache.commit(R0, HS[:n]) == n
    cache.release(R0)
    ok(cache)
    return cache


# --- BlockAllocator ------------------------------------------------------------------------


def gpu_pool(size: int = 4) -> BlockAllocator[GpuBlock]:
    return BlockAllocator("GPU", size, GpuBlock)


def test_allocate_then_free_round_trip() -> None:
    a = gpu_pool()
    got = a.allocate(3)
    assert len(set(got)) == 3 and a.num_free == 1
    assert not any(a.is_free(b) for b in got)
    a.free(got)
    assert a.num_free == 4 and sorted(a.free_blocks()) == list(range(4))
    assert all(a.is_free(b) for b in range(4))


def test_out_of_blocks_takes_nothing() -> None:
    a = gpu_pool()
    a.allocate(1)
    before = a.free_blocks()
    with pytest.raises(OutOfBlocks) as e:
        a.allocate(4)
    assert (e.value.wanted, e.value.free) == (4, 3)
    assert a.free_blocks() == before and a.num_free == 3


BAD_FREES: list[tuple[str, type[KVCacheError], list[int]]] = [
    ("already-free", DoubleFree, [3]),
    ("repeated-in-batch", DoubleFree, [0, 0]),
    ("last-already-free", DoubleFree, [0, 1, 3]),
    ("last-out-of-range", BlockOutOfRange, [0, 1, 4]),
    ("last-negative", BlockOutOfRange, [0, 1, -1]),
]


@pytest.mark.parametrize(("error", "batch"), [b[1:] for b in BAD_FREES], ids=[b[0] for b in BAD_FREES])
def test_bad_free_frees_nothing_of_the_batch(error: type[KVCacheError], batch: list[int]) -> None:
    a = gpu_pool()
    assert a.allocate(3) == [0, 1, 2]
    before = a.free_blocks()
    with pytest.raises(error):
        a.free([GpuBlock(b) for b in batch])
    assert a.free_blocks() == before
    assert [a.is_free(b) for b in range(4)] == [False, False, False, True]


def test_negative_pool_size_raises_value_error() -> None:
    with pytest.raises(ValueError):
        BlockAllocator("CPU", -1, CpuBlock)


# --- LeafHeap --------------------------------------------------------------------------------


def leaves(*ages: int) -> list[Node]:
    tree = RadixTree()
    out = []
    for i, age in enumerate(ages):
        n = tree.add_child(tree.root, BlockHash(i + 1), OnGpu(G(i)))
        n.last_access = age
        out.append(n)
    return out


def always(_: Node) -> bool:
    return True


def test_heap_pops_least_recently_used_first() -> None:
    a, b, c = leaves(3, 1, 2)
    heap = LeafHeap(GPU)
    for n in (a, b, c):
        heap.offer(n)
    assert [heap.pop_evictable(always, []) for _ in range(4)] == [b, c, a, None]
    assert not any(n.in_heap[GPU] for n in (a, b, c))


def test_offer_of_a_node_already_in_heap_adds_no_entry() -> None:
    (a,) = leaves(1)
    heap = LeafHeap(GPU)
    heap.offer(a)
    heap.offer(a)
    assert len(heap) == 1


def test_stale_entry_is_skipped_and_can_be_offered_again() -> None:
    a, b = leaves(1, 2)
    heap = LeafHeap(GPU)
    heap.offer(a)
    heap.offer(b)
    assert heap.pop_evictable(lambda n: n is not a, []) is b
    assert not a.in_heap[GPU] and len(heap) == 0
    heap.offer(a)
    assert len(heap) == 1
    assert heap.pop_evictable(always, []) is a


def test_node_used_after_push_is_requeued_at_its_new_age() -> None:
    a, b = leaves(1, 2)
    heap = LeafHeap(GPU)
    heap.offer(a)
    heap.offer(b)
    a.last_access = 5
    assert heap.pop_evictable(always, []) is b
    assert a.in_heap[GPU] and len(heap) == 1
    assert heap.pop_evictable(always, []) is a


def test_dead_node_is_never_popped() -> None:
    (a,) = leaves(1)
    heap = LeafHeap(GPU)
    heap.offer(a)
    a.alive = False
    assert heap.pop_evictable(always, []) is None


# --- CacheManager scenarios -------------------------------------------------------------------


def test_two_requests_share_a_prefix() -> None:
    cache = CacheManager(6, 2)
    other = block_hashes([1, 1, 2, 2, 4, 4], 2)
    cache.match(R0, HS)
    cache.allocate(R0, 3)
    cache.commit(R0, HS)
    rep = cache.match(R1, other)
    assert rep.gpu_hits == 2 and rep.swap_in is None and rep.prefetch is None
    assert [node(cache, h).refcount for h in HS] == [2, 2, 1]
    assert cache.table(R1) == cache.table(R0)[:2]
    cache.allocate(R1, 1)
    assert cache.commit(R1, other) == 1
    assert cache.tree.size == 4 and cache.gpu.num_free == 2
    ok(cache)


def test_evict_with_cpu_room_swaps_out() -> None:
    cache = cached(cpu=2)
    rep = cache.evict_gpu(1)
    assert rep.steps == (SwapOutTo(HS[1], C(0)),) and rep.swap_out is not None
    leaf = node(cache, HS[1])
    assert leaf.tier == SwappingOut(G(1), C(0)) and cache.gpu_pins == {G(1): 1}
    assert cache.gpu_evictable == 0  # the parent still has a GPU-side child
    ok(cache)
    cache.complete(rep.swap_out, Ok())
    assert node(cache, HS[1]).tier == OnCpu(C(0)) and cache.gpu.is_free(G(1)) and cache.gpu_pins == {}
    assert (cache.gpu_evictable, cache.cpu_evictable) == (1, 1)
    ok(cache)


def test_evict_without_cpu_tier_drops() -> None:
    cache = cached(cpu=0)
    rep = cache.evict_gpu(2)
    assert rep.steps == (Drop(HS[1]), Drop(HS[0])) and rep.swap_out is None
    assert cache.tree.size == 0 and cache.gpu.num_free == 4 and cache.jobs == {}
    ok(cache)


def test_evict_with_full_cpu_evicts_a_cpu_leaf_first() -> None:
    cache = cached(cpu=1)
    first = cache.evict_gpu(1)
    assert first.swap_out is not None
    cache.complete(first.swap_out, Ok())
    rep = cache.evict_gpu(1)
    assert rep.steps == (EvictCpu(HS[1]), SwapOutTo(HS[0], C(0)))
    ok(cache)


def cpu_hit() -> tuple[CacheManager, MatchReport]:
    """HS[1] was swapped out to CPU; R1 matches HS[:2]: one GPU hit and a swap-in of HS[1]."""
    cache = cached(cpu=2)
    out = cache.evict_gpu(1).swap_out
    assert out is not None
    cache.complete(out, Ok())
    rep = cache.match(R1, HS[:2])
    assert rep.gpu_hits == 1 and len(rep.swap_dests) == 1 and rep.swap_in is not None
    assert node(cache, HS[1]).tier == SwappingIn(C(0), rep.swap_dests[0])
    assert not cache.ready(R1) and cache.cpu_pins == {C(0): 1}
    ok(cache)
    return cache, rep


def test_swap_in_ok_puts_node_on_gpu_and_frees_cpu_block() -> None:
    cache, rep = cpu_hit()
    assert rep.swap_in is not None
    cache.complete(rep.swap_in, Ok())
    assert node(cache, HS[1]).tier == OnGpu(rep.swap_dests[0])
    assert cache.ready(R1) and cache.table(R1) == [G(0), rep.swap_dests[0]]
    assert cache.cpu.num_free == 2 and cache.cpu_pins == {}
    ok(cache)


def test_swap_in_error_cuts_path_and_turns_failed_block_private() -> None:
    cache, rep = cpu_hit()
    assert rep.swap_in is not None
    (extra,) = cache.allocate(R1, 1)
    cache.complete(rep.swap_in, Error())
    held = cache.requests[R1]
    assert [n.hash for n in held.path] == [HS[0]] and held.private == [rep.swap_dests[0], extra]
    assert cache.table(R1) == [G(0), rep.swap_dests[0], extra]
    assert node(cache, HS[1]).tier == OnCpu(C(0)) and node(cache, HS[1]).refcount == 0
    assert cache.ready(R1)
    ok(cache)


def test_swap_in_error_after_release_frees_failed_block() -> None:
    cache, rep = cpu_hit()
    assert rep.swap_in is not None
    free_before_match = cache.gpu.num_free + 1
    cache.release(R1)
    ok(cache)
    cache.complete(rep.swap_in, Error())
    assert cache.gpu.num_free == free_before_match and cache.gpu.is_free(rep.swap_dests[0])
    assert node(cache, HS[1]).tier == OnCpu(C(0))
    ok(cache)


def test_release_with_failed_write_still_frees_every_block() -> None:
    cache = CacheManager(4, 0)
    cache.match(R0, HS)
    cache.allocate(R0, 3)
    cache.commit(R0, HS[:2])
    rep = cache.release(R0, HS)
    assert rep.write is not None and len(rep.writes) == 3
    assert cache.gpu.num_free == 1  # the private block is adopted by the write
    ok(cache)
    cache.complete(rep.write, Error())
    assert cache.stored == set() and cache.gpu_pins == {} and cache.gpu.num_free == 2
    assert cache.gpu_evictable == 1
    cache.evict_gpu(2)
    assert cache.gpu.num_free == 4
    ok(cache)


def test_release_does_not_rewrite_stored_hashes() -> None:
    cache = CacheManager(4, 0)
    cache.match(R0, HS[:2])
    cache.allocate(R0, 2)
    first = cache.release(R0, HS[:1])
    assert first.write is not None
    cache.complete(first.write, Ok())
    cache.match(R1, [])
    cache.allocate(R1, 2)
    assert cache.release(R1, HS[:2]).writes == ((HS[1], G(1)),)


def test_reset_completes_transfers_and_frees_everything() -> None:
    cache, _ = cpu_hit()  # a swap-in in flight
    other = block_hashes([9, 9], 2)
    cache.match(R2, [])
    cache.allocate(R2, 1)
    cache.commit(R2, other)
    cache.release(R2)
    assert evicted(cache.evict_gpu(1).steps) == (SwapOutTo(other[0], C(1)),)  # a swap-out in flight
    r3 = RequestId(3)
    cache.match(r3, [])
    cache.allocate(r3, 1)
    assert cache.release(r3, HS[2:3]).write is not None  # a write in flight, adopting its block
    cache.release(R1)
    assert len(cache.jobs) == 3 and cache.gpu.num_free == 0
    ok(cache)
    cache.reset()
    assert cache.jobs == {} and cache.tree.size == 0
    assert cache.gpu.num_free == 4 and cache.cpu.num_free == 2
    assert cache.gpu_pins == {} and cache.cpu_pins == {}
    assert (cache.gpu_evictable, cache.cpu_evictable) == (0, 0)
    assert cache.stored == set()  # the write timed out
    ok(cache)


# --- bad input: the named error, and nothing changes --------------------------------------------

BAD_INPUTS: list[tuple[type[KVCacheError], Callable[[CacheManager, TransferId], object]]] = [
    (DuplicateRequest, lambda c, t: c.match(R1, [])),
    (UnknownRequest, lambda c, t: c.release(R2)),
    (UnknownRequest, lambda c, t: c.allocate(R2, 1)),
    (UnknownRequest, lambda c, t: c.commit(R2, [])),
    (UnknownTransfer, lambda c, t: c.complete(TransferId(t + 1), Ok())),
    (InvalidOutcome, lambda c, t: c.complete(t, Partial(2))),
    (InvalidOutcome, lambda c, t: c.complete(t, Partial(-1))),
    (HashMismatch, lambda c, t: c.commit(R1, [HS[1], HS[0]])),
    (HashMismatch, lambda c, t: c.commit(R1, HS[:1])),
    (HashMismatch, lambda c, t: c.commit(R1, HS)),
    (HashMismatch, lambda c, t: c.release(R1, HS)),
    (NotReady, lambda c, t: c.commit(R1, HS[:2])),
    (NotQuiescent, lambda c, t: c.reset()),
    (OutOfBlocks, lambda c, t: c.allocate(R1, c.gpu.num_free + 1)),
    (InvalidLimit, lambda c, t: c.match(R2, HS, limit=-1)),
]


@pytest.mark.parametrize(("error", "call"), BAD_INPUTS, ids=[f"{e.__name__}-{i}" for i, (e, _) in enumerate(BAD_INPUTS)])
def test_bad_input_raises_named_error_and_changes_nothing(
    error: type[KVCacheError], call: Callable[[CacheManager, TransferId], object]
) -> None:
    cache, rep = cpu_hit()
    assert rep.swap_in is not None
    before, seen = abstract(cache), view(cache)
    with pytest.raises(error):
        call(cache, rep.swap_in)
    assert abstract(cache) == before and view(cache) == seen
    ok(cache)


# --- refinement: each call is the spec action with the choices it reported --------------------


def step(cache: CacheManager, impl: Callable[[], T], spec: Callable[[CacheState, T], CacheState]) -> T:
    before = abstract(cache)
    result = impl()
    assert abstract(cache) == spec(before, result)
    ok(cache)
    return result


def test_every_call_refines_its_spec_action() -> None:
    c = CacheManager(4, 1)

    def match(r: RequestId, hashes: tuple[BlockHash, ...]) -> MatchReport:
        return step(
            c, lambda: c.match(r, hashes), lambda s, m: actions.match(s, r, hashes, m.swap_dests, m.prefetch_dests)
        )

    def complete(t: TransferId | None, outcome: Outcome) -> None:
        assert t is not None
        step(c, lambda: c.complete(t, outcome), lambda s, _: actions.complete(s, t, outcome))

    def evict_gpu(need: int) -> tuple[actions.EvictStep, ...]:
        rep = step(c, lambda: c.evict_gpu(need), lambda s, e: actions.evict(s, e.steps))
        return rep.steps

    assert match(R0, HS).hits == 0
    step(c, lambda: c.allocate(R0, 3), lambda s, got: actions.allocate(s, R0, got))
    step(c, lambda: c.commit(R0, HS), lambda s, _: actions.commit(s, R0, HS))
    write = step(c, lambda: c.release(R0, HS), lambda s, rep: actions.release(s, R0, rep.writes))
    complete(write.write, Ok())
    assert c.stored == set(HS)
    assert evicted(evict_gpu(1)) == (SwapOutTo(HS[2], C(0)),)
    complete(TransferId(1), Ok())
    assert evicted(evict_gpu(1)) == (EvictCpu(HS[2]), SwapOutTo(HS[1], C(0)))
    complete(TransferId(2), Error())
    prefetch = match(R1, HS)  # HS[2] left the tree but is in storage
    assert (prefetch.gpu_hits, len(prefetch.prefetch_dests)) == (2, 1)
    complete(prefetch.prefetch, Ok())
    step(c, lambda: c.commit(R1, HS), lambda s, _: actions.commit(s, R1, HS))
    step(c, lambda: c.release(R1), lambda s, rep: actions.release(s, R1, rep.writes))
    assert evicted(evict_gpu(1)) == (SwapOutTo(HS[2], C(0)),)
    complete(TransferId(4), Partial(1))
    swap = match(R2, HS)
    assert (swap.gpu_hits, len(swap.swap_dests)) == (2, 1)
    step(c, lambda: c.release(R2), lambda s, rep: actions.release(s, R2, rep.writes))
    complete(swap.swap_in, Partial(0))
    step(c, lambda: c.evict_cpu(1), lambda s, rep: actions.evict(s, rep.steps))
    step(c, c.reset, lambda s, _: actions.reset(s))
    assert c.gpu.num_free == 4 and c.tree.size == 0
