"""Unit tests of the reference cache: allocator, LRU heap, CacheManager scenarios, refinement.

The tests assert what spec/ guarantees. Where spec/ leaves a choice open (which free
block a call takes, which CPU block a swap-out writes, which evictable node goes first,
how many CPU and storage hits a match takes), a test reads the choice from the cache's
report or state, never assumes it. The few tests of the reference's own choices (LIFO
reuse, ascending ids from a fresh pool, LRU order, every hit taken) are named after the
choice and say in their docstring that spec/ leaves it open.
"""

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
from kvoracle.kvcache.manager import CacheManager, EvictReport, MatchReport
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
    gpu_block_of,
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


def block_of(cache: CacheManager, h: BlockHash) -> GpuBlock:
    """The GPU block node h sits on, whichever the cache chose."""
    n = node(cache, h)
    assert n.tier is not None
    g = gpu_block_of(n.tier)
    assert g is not None, f"node {h:#x} is {n.tier}"
    return g


def swapped_to(rep: EvictReport, h: BlockHash) -> CpuBlock:
    """The CPU block the eviction reported for node h's swap-out (spec/ leaves which one open)."""
    (c,) = [s.cpu for s in rep.steps if isinstance(s, SwapOutTo) and s.node == h]
    return c


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


# A bad batch, built from the blocks the pool handed out (`held`), the one it kept free
# (`spare`) and its size; the last block of each batch is the bad one.
BAD_FREES: list[tuple[str, type[KVCacheError], Callable[[list[GpuBlock], GpuBlock, int], list[int]]]] = [
    ("already-free", DoubleFree, lambda held, spare, size: [spare]),
    ("repeated-in-batch", DoubleFree, lambda held, spare, size: [held[0], held[0]]),
    ("last-already-free", DoubleFree, lambda held, spare, size: [held[0], held[1], spare]),
    ("last-out-of-range", BlockOutOfRange, lambda held, spare, size: [held[0], held[1], size]),
    ("last-negative", BlockOutOfRange, lambda held, spare, size: [held[0], held[1], -1]),
]


@pytest.mark.parametrize(("error", "bad_batch"), [b[1:] for b in BAD_FREES], ids=[b[0] for b in BAD_FREES])
def test_bad_free_frees_nothing_of_the_batch(
    error: type[KVCacheError], bad_batch: Callable[[list[GpuBlock], GpuBlock, int], list[int]]
) -> None:
    a = gpu_pool()
    held = a.allocate(3)
    (spare,) = a.free_blocks()
    assert sorted([*held, spare]) == list(range(4))
    before = a.free_blocks()
    batch = bad_batch(held, spare, a.size)
    with pytest.raises(error) as e:
        a.free([GpuBlock(b) for b in batch])
    assert isinstance(e.value, DoubleFree | BlockOutOfRange) and e.value.block == batch[-1]
    assert a.free_blocks() == before
    assert [a.is_free(b) for b in range(4)] == [b == spare for b in range(4)]


def test_fresh_allocator_hands_out_the_lowest_ids_first() -> None:
    """The reference's choice, which spec/ leaves open (its actions take the blocks as
    arguments): a fresh pool hands out its blocks in ascending order."""
    a = gpu_pool()
    assert a.allocate(3) == [0, 1, 2]
    assert a.allocate(1) == [3]


def test_allocator_reuses_the_last_freed_block_first() -> None:
    """The reference's choice, which spec/ leaves open (its actions take the blocks as
    arguments): the free list is a LIFO stack, so the block freed last is reused first."""
    a = gpu_pool()
    a.allocate(4)
    a.free([GpuBlock(1)])
    a.free([GpuBlock(3), GpuBlock(0)])
    assert a.allocate(1) == [0]
    assert a.allocate(2) == [3, 1]


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
    """The reference's choice, which spec/ leaves open (spec.actions.evict takes the node
    as an argument, any node with an entry that is evictable): least recently used first."""
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
    stale: list[Node] = []
    assert [heap.pop_evictable(lambda n: n is not a, stale) for _ in range(2)] == [b, None]  # whatever the order
    assert stale == [a] and not a.in_heap[GPU] and len(heap) == 0
    heap.offer(a)
    assert len(heap) == 1
    assert heap.pop_evictable(always, []) is a


def test_lru_requeues_a_node_used_after_push_at_its_new_age() -> None:
    """Depends on the reference's LRU order, which spec/ leaves open: a node used after its
    entry was pushed is evicted after an older one."""
    a, b = leaves(1, 2)
    heap = LeafHeap(GPU)
    heap.offer(a)
    heap.offer(b)
    a.last_access = 5
    assert heap.pop_evictable(always, []) is b
    assert a.in_heap[GPU] and len(heap) == 1
    assert heap.pop_evictable(always, []) is a


def test_lru_order_counts_a_release_as_a_use() -> None:
    """The reference's choice (spec/ leaves which evictable node goes first open): a
    prefix is used when a request releases it, not only when one takes it. B, taken
    after A but released before it, is evicted first."""
    cache = CacheManager(4, 0)
    a, b = block_hashes([1, 1], 2), block_hashes([3, 3], 2)
    for r, hashes in ((R0, a), (R1, b)):
        cache.match(r, hashes)
        cache.allocate(r, 1)
        cache.commit(r, hashes)
    cache.release(R1)
    cache.release(R0)
    assert cache.evict_gpu(1).steps == (Drop(b[0]),)
    ok(cache)


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
    g, before = block_of(cache, HS[1]), abstract(cache)
    rep = cache.evict_gpu(1)
    c = swapped_to(rep, HS[1])
    assert rep.steps == (SwapOutTo(HS[1], c),) and rep.swap_out is not None
    assert c in before.cpu_free and not cache.cpu.is_free(c)  # the destination was free, and is taken
    assert abstract(cache) == actions.evict(before, rep.steps)
    leaf = node(cache, HS[1])
    assert leaf.tier == SwappingOut(g, c) and cache.gpu_pins == {g: 1}
    assert cache.gpu_evictable == 0  # the parent still has a GPU-side child
    ok(cache)
    cache.complete(rep.swap_out, Ok())
    assert node(cache, HS[1]).tier == OnCpu(c) and cache.gpu.is_free(g) and cache.gpu_pins == {}
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
    assert rep.steps == (EvictCpu(HS[1]), SwapOutTo(HS[0], C(0)))  # C(0): the only CPU block
    ok(cache)


def cpu_hit() -> tuple[CacheManager, MatchReport, CpuBlock]:
    """HS[1] was swapped out to CPU block c (whichever eviction chose); R1 matches HS[:2]:
    one GPU hit and a swap-in of HS[1] from c. Returns the cache, the match's report and c."""
    cache = cached(cpu=2)
    evict = cache.evict_gpu(1)
    c = swapped_to(evict, HS[1])
    assert evict.swap_out is not None
    cache.complete(evict.swap_out, Ok())
    before = abstract(cache)
    rep = cache.match(R1, HS[:2])
    assert rep.gpu_hits == 1 and rep.prefetch_dests == ()
    if rep.swap_in is None:  # the reference takes it: test_match_takes_every_cpu_and_storage_hit_the_limit_allows
        pytest.skip("the cache took no CPU hit (spec/ leaves how many open): there is no swap-in to test")
    (dest,) = rep.swap_dests
    assert dest in before.gpu_free and not cache.gpu.is_free(dest)  # the destination was free, and is taken
    assert abstract(cache) == actions.match(before, R1, HS[:2], rep.swap_dests, rep.prefetch_dests)
    assert node(cache, HS[1]).tier == SwappingIn(c, dest)
    assert not cache.ready(R1) and cache.cpu_pins == {c: 1}
    ok(cache)
    return cache, rep, c


def test_swap_in_ok_puts_node_on_gpu_and_frees_cpu_block() -> None:
    cache, rep, c = cpu_hit()
    assert rep.swap_in is not None
    g0 = block_of(cache, HS[0])
    cache.complete(rep.swap_in, Ok())
    assert node(cache, HS[1]).tier == OnGpu(rep.swap_dests[0])
    assert cache.ready(R1) and cache.table(R1) == [g0, rep.swap_dests[0]]
    assert cache.cpu.num_free == 2 and cache.cpu.is_free(c) and cache.cpu_pins == {}
    ok(cache)


def test_swap_in_error_cuts_path_and_turns_failed_block_private() -> None:
    cache, rep, c = cpu_hit()
    assert rep.swap_in is not None
    g0 = block_of(cache, HS[0])
    (extra,) = cache.allocate(R1, 1)
    cache.complete(rep.swap_in, Error())
    held = cache.requests[R1]
    assert [n.hash for n in held.path] == [HS[0]] and held.private == [rep.swap_dests[0], extra]
    assert cache.table(R1) == [g0, rep.swap_dests[0], extra]
    assert node(cache, HS[1]).tier == OnCpu(c) and node(cache, HS[1]).refcount == 0
    assert cache.ready(R1)
    ok(cache)


def test_swap_in_error_after_release_frees_failed_block() -> None:
    cache, rep, c = cpu_hit()
    assert rep.swap_in is not None
    free_before_match = cache.gpu.num_free + 1
    cache.release(R1)
    ok(cache)
    cache.complete(rep.swap_in, Error())
    assert cache.gpu.num_free == free_before_match and cache.gpu.is_free(rep.swap_dests[0])
    assert node(cache, HS[1]).tier == OnCpu(c)
    ok(cache)


def three_tiers() -> CacheManager:
    """HS[0] on GPU, HS[1] on CPU, HS[2] only in storage; nothing live, nothing in flight."""
    cache = CacheManager(6, 2)
    cache.match(R0, HS)
    cache.allocate(R0, 3)
    cache.commit(R0, HS)
    write = cache.release(R0, HS).write
    assert write is not None
    cache.complete(write, Ok())
    for _ in range(2):  # HS[2], then HS[1], go to CPU
        out = cache.evict_gpu(1).swap_out
        assert out is not None
        cache.complete(out, Ok())
    assert evicted(cache.evict_cpu(1).steps) == (EvictCpu(HS[2]),)
    assert [type(node(cache, h).tier) for h in HS[:2]] == [OnGpu, OnCpu] and cache.stored == set(HS)
    ok(cache)
    return cache


@pytest.mark.parametrize(("limit", "swapped", "fetched"), [(0, 0, 0), (1, 1, 0), (2, 1, 1), (None, 1, 1)])
def test_match_takes_every_cpu_and_storage_hit_the_limit_allows(limit: int | None, swapped: int, fetched: int) -> None:
    """The reference's choice, which spec/ leaves open (spec.actions.match takes the
    destinations as arguments; spec/next.py enumerates how many hits to take): after the
    GPU prefix (always taken), match swaps in every CPU-resident node and then prefetches
    every stored block, as far as `limit` and the free GPU blocks allow."""
    cache = three_tiers()
    before = abstract(cache)
    rep = cache.match(R1, HS, limit=limit)
    assert (rep.gpu_hits, len(rep.swap_dests), len(rep.prefetch_dests)) == (1, swapped, fetched)
    assert (rep.swap_in is not None, rep.prefetch is not None) == (swapped > 0, fetched > 0)
    assert abstract(cache) == actions.match(before, R1, HS, rep.swap_dests, rep.prefetch_dests)
    ok(cache)


@pytest.mark.parametrize("limit", [2, 5, None])
def test_a_limit_above_the_free_blocks_takes_only_what_is_free(limit: int | None) -> None:
    """A caller's limit is a ceiling, not a promise of room: with one GPU block free, the
    match swaps in the CPU hit and stops there (24th blind run: a match that trusted the
    limit raised OutOfBlocks after it had taken the block)."""
    cache = three_tiers()
    cache.match(R2, [])
    cache.allocate(R2, cache.gpu.num_free - 1)  # another request holds every free block but one
    before = abstract(cache)
    rep = cache.match(R1, HS, limit=limit)
    assert (rep.gpu_hits, len(rep.swap_dests), len(rep.prefetch_dests), cache.gpu.num_free) == (1, 1, 0, 0)
    assert abstract(cache) == actions.match(before, R1, HS, rep.swap_dests, rep.prefetch_dests)
    ok(cache)


def test_a_request_is_ready_only_when_its_swap_in_and_its_prefetch_have_both_ended() -> None:
    """commit waits for every fill of the request, whichever ends first."""
    cache = three_tiers()
    rep = cache.match(R1, HS)
    assert rep.swap_in is not None and rep.prefetch is not None
    assert cache.jobs[rep.swap_in].id == rep.swap_in
    cache.complete(rep.swap_in, Ok())
    assert not cache.ready(R1)
    cache.complete(rep.prefetch, Ok())
    assert cache.ready(R1)
    ok(cache)


def test_a_release_during_a_prefetch_frees_every_private_block_once_the_fills_end() -> None:
    """Releasing a request whose fills are in flight leaks nothing (LIVE-DRAIN)."""
    cache = three_tiers()
    rep = cache.match(R1, HS)
    assert rep.swap_in is not None and rep.prefetch is not None
    cache.allocate(R1, 1)
    cache.release(R1)
    ok(cache)
    cache.complete(rep.swap_in, Ok())
    cache.complete(rep.prefetch, Ok())
    ok(cache)  # INV-CONSERVE: a private block neither freed nor owned is a leak


def test_a_request_that_is_not_ready_writes_nothing_on_release() -> None:
    """Blocks still being filled are never written to storage (their bytes are not there yet)."""
    cache = CacheManager(6, 2)
    hashes = block_hashes([1, 1, 2, 2, 3, 3, 4, 4], 2)
    cache.match(R0, hashes[:3])
    cache.allocate(R0, 3)
    cache.commit(R0, hashes[:3])
    write = cache.release(R0, hashes[:3]).write
    assert write is not None
    cache.complete(write, Ok())
    for _ in range(2):
        out = cache.evict_gpu(1).swap_out
        assert out is not None
        cache.complete(out, Ok())
    cache.evict_cpu(1)
    rep = cache.match(R1, hashes)
    assert rep.swap_in is not None or rep.prefetch is not None
    cache.allocate(R1, 1)
    assert not cache.ready(R1)
    assert cache.release(R1, hashes).write is None
    ok(cache)


def test_a_cache_built_without_a_cpu_pool_has_no_cpu_tier() -> None:
    """CacheManager(G) has no CPU tier: eviction drops, it never swaps out."""
    cache = CacheManager(4)
    assert cache.cpu.size == 0
    cache.match(R0, HS[:1])
    cache.allocate(R0, 1)
    cache.commit(R0, HS[:1])
    cache.release(R0)
    assert cache.evict_gpu(1) == EvictReport((Drop(HS[0]),), None)


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


@pytest.mark.parametrize("done", [0, 1, 2])
def test_a_partial_write_stores_only_its_leading_items(done: int) -> None:
    cache = CacheManager(4, 0)
    cache.match(R0, HS)
    cache.allocate(R0, 3)
    cache.commit(R0, HS[:2])
    rep = cache.release(R0, HS)
    assert rep.write is not None and [h for h, _ in rep.writes] == list(HS)
    cache.complete(rep.write, Partial(done))
    assert cache.stored == set(HS[:done]) and cache.gpu_pins == {} and cache.gpu.num_free == 2
    ok(cache)


def test_release_does_not_rewrite_stored_hashes() -> None:
    cache = CacheManager(4, 0)
    cache.match(R0, HS[:2])
    cache.allocate(R0, 2)
    first = cache.release(R0, HS[:1])
    assert first.write is not None
    cache.complete(first.write, Ok())
    cache.match(R1, [])
    blocks = cache.allocate(R1, 2)
    assert cache.release(R1, HS[:2]).writes == ((HS[1], blocks[1]),)


def test_reset_completes_transfers_and_frees_everything() -> None:
    cache, _, c = cpu_hit()  # a swap-in in flight, from CPU block c
    other = block_hashes([9, 9], 2)
    cache.match(R2, [])
    cache.allocate(R2, 1)
    cache.commit(R2, other)
    cache.release(R2)
    (spare,) = abstract(cache).cpu_free
    assert spare != c
    assert evicted(cache.evict_gpu(1).steps) == (SwapOutTo(other[0], spare),)  # a swap-out in flight
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
    cache, rep, _ = cpu_hit()
    assert rep.swap_in is not None
    before, seen = abstract(cache), view(cache)
    with pytest.raises(error):
        call(cache, rep.swap_in)
    assert abstract(cache) == before and view(cache) == seen
    ok(cache)


NAMED: list[tuple[str, Callable[[CacheManager, TransferId], object], Callable[[TransferId], object]]] = [
    ("request", lambda c, t: c.match(R1, []), lambda t: R1),
    ("request", lambda c, t: c.release(R2), lambda t: R2),
    ("transfer", lambda c, t: c.complete(TransferId(t + 1), Ok()), lambda t: TransferId(t + 1)),
    ("transfer", lambda c, t: c.complete(t, Partial(2)), lambda t: t),
    ("request", lambda c, t: c.commit(R1, [HS[1], HS[0]]), lambda t: R1),
    ("request", lambda c, t: c.commit(R1, HS[:1]), lambda t: R1),
    ("request", lambda c, t: c.commit(R1, HS), lambda t: R1),
    ("request", lambda c, t: c.release(R1, HS), lambda t: R1),
    ("request", lambda c, t: c.commit(R1, HS[:2]), lambda t: R1),
    ("requests", lambda c, t: c.reset(), lambda t: [R1]),
    ("limit", lambda c, t: c.match(R2, HS, limit=-1), lambda t: -1),
]


@pytest.mark.parametrize(("field", "call", "subject"), NAMED, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(NAMED)])
def test_bad_input_error_names_what_was_bad(field: str, call: Callable[[CacheManager, TransferId], object],
                                            subject: Callable[[TransferId], object]) -> None:
    """The error carries the offending request, transfer or limit, for the caller to act on."""
    cache, rep, _ = cpu_hit()
    assert rep.swap_in is not None
    with pytest.raises(KVCacheError) as e:
        call(cache, rep.swap_in)
    assert getattr(e.value, field) == subject(rep.swap_in)


# --- refinement: each call is the spec action with the choices it reported --------------------


def step(cache: CacheManager, impl: Callable[[], T], spec: Callable[[CacheState, T], CacheState]) -> T:
    before = abstract(cache)
    result = impl()
    assert abstract(cache) == spec(before, result)
    ok(cache)
    return result


def test_every_call_refines_its_spec_action() -> None:
    """Whatever the cache chooses (it reports it), each call is the spec action with those
    choices. How many CPU and storage hits a match takes is open: the run follows the report."""
    c = CacheManager(4, 1)  # one CPU block: every swap-out goes to C(0)

    def match(r: RequestId, hashes: tuple[BlockHash, ...]) -> MatchReport:
        return step(
            c, lambda: c.match(r, hashes), lambda s, m: actions.match(s, r, hashes, m.swap_dests, m.prefetch_dests)
        )

    def complete(t: TransferId | None, outcome: Outcome) -> None:
        assert t is not None
        step(c, lambda: c.complete(t, outcome), lambda s, _: actions.complete(s, t, outcome))

    def evict_gpu(need: int) -> EvictReport:
        return step(c, lambda: c.evict_gpu(need), lambda s, e: actions.evict(s, e.steps))

    def allocate(r: RequestId, n: int) -> None:
        step(c, lambda: c.allocate(r, n), lambda s, got: actions.allocate(s, r, got))

    assert match(R0, HS).hits == 0
    allocate(R0, 3)
    step(c, lambda: c.commit(R0, HS), lambda s, _: actions.commit(s, R0, HS))
    write = step(c, lambda: c.release(R0, HS), lambda s, rep: actions.release(s, R0, rep.writes))
    complete(write.write, Ok())
    assert c.stored == set(HS)
    out = evict_gpu(1)
    assert evicted(out.steps) == (SwapOutTo(HS[2], C(0)),)
    complete(out.swap_out, Ok())
    out = evict_gpu(1)
    assert evicted(out.steps) == (EvictCpu(HS[2]), SwapOutTo(HS[1], C(0)))
    complete(out.swap_out, Error())
    prefetch = match(R1, HS)  # HS[2] left the tree but is in storage
    assert prefetch.gpu_hits == 2 and prefetch.swap_in is None
    if prefetch.prefetch is not None:  # the reference prefetches it
        complete(prefetch.prefetch, Ok())
    if prefetch.hits < len(HS):
        allocate(R1, len(HS) - prefetch.hits)
    step(c, lambda: c.commit(R1, HS), lambda s, _: actions.commit(s, R1, HS))
    step(c, lambda: c.release(R1), lambda s, rep: actions.release(s, R1, rep.writes))
    out = evict_gpu(1)
    assert evicted(out.steps) == (SwapOutTo(HS[2], C(0)),)
    complete(out.swap_out, Partial(1))
    swap = match(R2, HS)  # HS[2] is on CPU, and in storage
    assert swap.gpu_hits == 2
    step(c, lambda: c.release(R2), lambda s, rep: actions.release(s, R2, rep.writes))
    for fill in (swap.swap_in, swap.prefetch):  # the reference swaps it in
        if fill is not None:
            complete(fill, Partial(0))
    step(c, lambda: c.evict_cpu(1), lambda s, rep: actions.evict(s, rep.steps))
    step(c, c.reset, lambda s, _: actions.reset(s))
    assert c.gpu.num_free == 4 and c.tree.size == 0
