"""The cache-layer actions: each a pure function state -> state with a precondition.

Where the specification allows a choice (which free blocks, which evictable node,
how many CPU or storage hits to take), the choice is an argument; the precondition
says which choices are allowed. An implementation reports the choices it made, and
refinement replays them here.

Every action ends by settling the LRU heaps (`settle`): entries and flags of nodes
that left the tree vanish, and every evictable node without a flag is offered. Only
eviction removes a live node's entry: it evicts a node it found there, or pops a
stale entry (SkipStale), which clears the flag so the node is offered again the
moment it is evictable again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Mapping, ParamSpec, Sequence, TypeVar

from kvoracle.spec.frozen import replace
from kvoracle.spec.state import (
    CacheState,
    Heap,
    Holding,
    Node,
    Prefetch,
    StorageWrite,
    SwapIn,
    SwapOut,
    Transfer,
    cpu_evictable,
    cpu_unevictable,
    evictable_nodes,
    gpu_evictable,
    gpu_unevictable,
)
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    GpuBlock,
    OnCpu,
    OnGpu,
    Outcome,
    Partial,
    RequestId,
    SwappingIn,
    SwappingOut,
    Tier,
    Timeout,
    TransferId,
    gpu_block_of,
    succeeded,
)

K = TypeVar("K")
V = TypeVar("V")
B = TypeVar("B", GpuBlock, CpuBlock)  # a block id of either tier
P = ParamSpec("P")


class PreconditionError(Exception):
    """An action was applied where its precondition does not hold."""

    def __init__(self, action: str, reason: str) -> None:
        super().__init__(f"{action}: {reason}")
        self.action = action
        self.reason = reason


def require(ok: bool, action: str, reason: str) -> None:
    """The enabling condition of `action`: PreconditionError(action, reason) unless `ok`."""
    if not ok:
        raise PreconditionError(action, reason)


def _put(m: Mapping[K, V], k: K, v: V) -> dict[K, V]:
    d = dict(m)
    d[k] = v
    return d


def _without(m: Mapping[K, V], k: K) -> dict[K, V]:
    d = dict(m)
    del d[k]
    return d


def _bump(pins: Mapping[K, int], k: K, by: int) -> dict[K, int]:
    d = dict(pins)
    d[k] = d.get(k, 0) + by
    if d[k] == 0:
        del d[k]
    return d


def _take_free(free: tuple[B, ...], blocks: Sequence[B], action: str, size: int) -> tuple[B, ...]:
    require(len(set(blocks)) == len(blocks), action, f"blocks {list(blocks)} repeat")
    rest = list(free)
    for b in blocks:
        require(0 <= b < size, action, f"block {b} is out of range: the tier has "
                + (f"blocks 0 to {size - 1}" if size else "no blocks"))
        require(b in rest, action, f"block {b} is not free")
        rest.remove(b)
    return tuple(rest)


def _give_free(free: tuple[K, ...], blocks: Sequence[K]) -> tuple[K, ...]:
    return tuple(sorted([*free, *blocks]))  # type: ignore[type-var]


def _adjust_ref(nodes: Mapping[BlockHash, Node], path: Sequence[BlockHash], by: int) -> dict[BlockHash, Node]:
    d = dict(nodes)
    for h in path:
        d[h] = replace(d[h], refcount=d[h].refcount + by)
    return d


def _new_transfer(s: CacheState, t: Transfer) -> CacheState:
    tid = TransferId(s.next_transfer)
    return replace(s, transfers=_put(s.transfers, tid, t), next_transfer=s.next_transfer + 1)


def settle(s: CacheState) -> CacheState:
    """The heaps after a step: only live nodes keep entries and flags; every evictable
    node without a flag gets an entry (it is offered to its tier's heap)."""
    gpu_evictable_now, cpu_evictable_now = evictable_nodes(s)
    gpu = _settled(s.gpu_heap, s, gpu_evictable_now)
    cpu = _settled(s.cpu_heap, s, cpu_evictable_now)
    if gpu == s.gpu_heap and cpu == s.cpu_heap:
        return s
    return replace(s, gpu_heap=gpu, cpu_heap=cpu)


def _settled(heap: Heap, s: CacheState, evictable: Sequence[BlockHash]) -> Heap:
    offered = frozenset(evictable) - heap.flagged
    live = s.nodes.keys()
    if not offered and heap.entries <= live and heap.flagged <= live:
        return heap  # no node left the tree, none became evictable unflagged: the heap stands
    return Heap(heap.entries.intersection(live) | offered, heap.flagged.intersection(live) | offered)


def _settles(action: Callable[P, CacheState]) -> Callable[P, CacheState]:
    """The action, followed by `settle`."""

    @functools.wraps(action)
    def step(*args: P.args, **kwargs: P.kwargs) -> CacheState:
        return settle(action(*args, **kwargs))

    return step


def table(s: CacheState, r: RequestId) -> tuple[GpuBlock, ...]:
    """The request's block table: the GPU block of each path node, then its private blocks."""
    held = s.requests[r]
    listed = [gpu_block_of(s.nodes[h].tier) for h in held.path if h in s.nodes]
    return tuple(g for g in listed if g is not None) + held.private


# --- match ----------------------------------------------------------------------


def gpu_hits(s: CacheState, hashes: Sequence[BlockHash]) -> int:
    """Length of the longest prefix of `hashes` whose nodes are all OnGpu."""
    parent: BlockHash | None = None
    for i, h in enumerate(hashes):
        n = s.nodes.get(h)
        if n is None or n.parent != parent or not isinstance(n.tier, OnGpu):
            return i
        parent = h
    return len(hashes)


@_settles
def match(
    s: CacheState,
    r: RequestId,
    hashes: Sequence[BlockHash],
    swap_dests: Sequence[GpuBlock] = (),
    prefetch_dests: Sequence[GpuBlock] = (),
    limit: int | None = None,
) -> CacheState:
    """Request r takes a reference on its GPU-resident prefix, then swaps in the next
    len(swap_dests) nodes from CPU and prefetches the next len(prefetch_dests) blocks
    from storage, at most `limit` GPU blocks for the two when the caller set one. A
    node in transit is never matched (the match stops there)."""
    a = "match"
    require(r not in s.requests, a, f"request {r} already holds blocks")
    taken = len(swap_dests) + len(prefetch_dests)
    require(limit is None or taken <= limit, a, f"{taken} GPU blocks swapped in and prefetched for a limit of {limit}")
    gpu_free = _take_free(s.gpu_free, [*swap_dests, *prefetch_dests], a, s.gpu_size)
    n_gpu = gpu_hits(s, hashes)
    path = list(hashes[:n_gpu])
    nodes = dict(s.nodes)
    cpu_pins = dict(s.cpu_pins)
    swaps: list[tuple[BlockHash, CpuBlock, GpuBlock]] = []
    for g in swap_dests:
        i = len(path)
        require(i < len(hashes), a, "more swap-in blocks than hashes")
        h = hashes[i]
        n = nodes.get(h)
        require(
            n is not None and isinstance(n.tier, OnCpu) and n.parent == (path[-1] if path else None),
            a,
            f"block {i} (hash {h:#x}) is not a CPU hit",
        )
        assert n is not None and isinstance(n.tier, OnCpu)
        nodes[h] = replace(n, tier=SwappingIn(n.tier.cpu, g))
        cpu_pins = _bump(cpu_pins, n.tier.cpu, 1)
        swaps.append((h, n.tier.cpu, g))
        path.append(h)
    fetches: list[tuple[BlockHash, GpuBlock]] = []
    for g in prefetch_dests:
        i = len(path) + len(fetches)
        require(i < len(hashes) and hashes[i] in s.stored, a,
                f"prefetch into GPU block {g}: the prompt's block {i} "
                + (f"({hashes[i]:#x}) is not in storage" if i < len(hashes) else "does not exist (the prompt is shorter)"))
        fetches.append((hashes[i], g))
    nodes = _adjust_ref(nodes, path, +1)
    out = replace(
        s,
        gpu_free=gpu_free,
        nodes=nodes,
        cpu_pins=cpu_pins,
        requests=_put(s.requests, r, Holding(tuple(path), tuple(prefetch_dests))),
    )
    if swaps:
        out = _new_transfer(out, SwapIn(r, tuple(swaps)))
    if fetches:
        out = _new_transfer(out, Prefetch(r, tuple(fetches)))
    return out


# --- allocate, commit -------------------------------------------------------------


@_settles
def allocate(s: CacheState, r: RequestId, blocks: Sequence[GpuBlock], asked: int | None = None) -> CacheState:
    """Free blocks join the end of r's private blocks; `asked`: as many as the caller
    asked for (None: any number, as the scheduler's prefill and decode take)."""
    a = "allocate"
    require(r in s.requests, a, f"unknown request {r}")
    require(asked is None or len(blocks) == asked, a, f"{len(blocks)} blocks given for {asked} asked")
    gpu_free = _take_free(s.gpu_free, blocks, a, s.gpu_size)
    held = s.requests[r]
    return replace(
        s,
        gpu_free=gpu_free,
        requests=_put(s.requests, r, Holding(held.path, held.private + tuple(blocks))),
    )


def ready(s: CacheState, r: RequestId) -> bool:
    """No part of r's table is still being filled."""
    held = s.requests[r]
    if any(not isinstance(s.nodes[h].tier, OnGpu) for h in held.path):
        return False
    dests = {g for t in s.transfers.values() if isinstance(t, Prefetch) and t.request == r for _, g in t.items}
    return not dests.intersection(held.private)


@_settles
def commit(s: CacheState, r: RequestId, hashes: Sequence[BlockHash]) -> CacheState:
    """r's full blocks named by `hashes` become tree nodes, in order, up to the first
    whose hash is already in the tree: that block and every later one stay private."""
    a = "commit"
    require(r in s.requests, a, f"unknown request {r}")
    held = s.requests[r]
    require(tuple(hashes[: len(held.path)]) == held.path, a, "hashes disagree with the matched path")
    require(len(hashes) <= len(held.path) + len(held.private), a, "more hashes than blocks")
    require(ready(s, r), a, f"request {r} still has blocks in flight")
    path, private, nodes = list(held.path), list(held.private), dict(s.nodes)
    for h in hashes[len(held.path) :]:
        if h in nodes:
            break
        nodes[h] = Node(path[-1] if path else None, OnGpu(private.pop(0)), refcount=1)
        path.append(h)
    return replace(s, nodes=nodes, requests=_put(s.requests, r, Holding(tuple(path), tuple(private))))


# --- release (with an optional storage write first) -------------------------------


@_settles
def release(
    s: CacheState, r: RequestId, writes: Sequence[tuple[BlockHash, GpuBlock]] = ()
) -> CacheState:
    """Start a storage write of `writes` (blocks of r's table, pinned until it ends),
    then release r whatever the write will do: refcounts on its path go down, its
    private blocks become free, except those a transfer still needs, which that
    transfer adopts and frees when it completes."""
    a = "release"
    require(r in s.requests, a, f"unknown request {r}")
    listed = table(s, r)
    require(all(g in listed for _, g in writes), a, "a written block is not in the request's table")
    require(ready(s, r) or not writes, a, "cannot write blocks still being filled")
    held = s.requests[r]
    gpu_pins = dict(s.gpu_pins)
    for _, g in writes:
        gpu_pins = _bump(gpu_pins, g, 1)
    out = replace(s, gpu_pins=gpu_pins)
    write_id = TransferId(s.next_transfer)
    if writes:
        out = _new_transfer(out, StorageWrite(tuple(writes)))
    transfers = dict(out.transfers)
    fetching: set[GpuBlock] = set()
    for tid, t in out.transfers.items():
        if isinstance(t, SwapIn | Prefetch) and t.request == r:
            transfers[tid] = replace(t, request=None)
            if isinstance(t, Prefetch):
                fetching.update(g for _, g in t.items)
    freed: list[GpuBlock] = []
    for g in held.private:
        if g in fetching:
            continue  # the prefetch already owns it and frees it when it ends
        if gpu_pins.get(g, 0):
            w = transfers.get(write_id)
            require(isinstance(w, StorageWrite), a, f"private block {g} is pinned by no write")
            assert isinstance(w, StorageWrite)
            transfers[write_id] = replace(w, adopted=w.adopted + (g,))
        else:
            freed.append(g)
    return replace(
        out,
        nodes=_adjust_ref(s.nodes, held.path, -1),
        requests=_without(s.requests, r),
        transfers=transfers,
        gpu_free=_give_free(s.gpu_free, freed),
    )


# --- eviction -------------------------------------------------------------------


@dataclass(frozen=True)
class EvictCpu:
    node: BlockHash


@dataclass(frozen=True)
class SwapOutTo:
    node: BlockHash
    cpu: CpuBlock


@dataclass(frozen=True)
class Drop:
    node: BlockHash


@dataclass(frozen=True)
class SkipStale:
    """Eviction popped the entry of a node that is not evictable on that tier: the entry
    goes, the flag is cleared (the node is offered again once evictable)."""

    node: BlockHash
    tier: Tier


EvictStep = EvictCpu | SwapOutTo | Drop | SkipStale


def _cpu_has_room(s: CacheState) -> bool:
    return bool(s.cpu_free) or any(cpu_evictable(s, h) for h in s.nodes)


def _popped(heap: Heap, h: BlockHash) -> Heap:
    return Heap(heap.entries - {h}, heap.flagged - {h})


def evict(s: CacheState, steps: Sequence[EvictStep]) -> CacheState:
    """Apply eviction steps in order, each on a node eviction found in its tier's heap.
    A GPU-evictable node is swapped out to a free CPU block while the CPU tier has room
    (free, or made free by evicting CPU leaves) and dropped only when it has none. The
    heaps settle after each step (a parent may become evictable within the same call).
    All swaps of one call form one transfer."""
    swaps: list[tuple[BlockHash, GpuBlock, CpuBlock]] = []
    for i, step in enumerate(steps, 1):
        try:
            s = settle(_evict_one(s, step, swaps))
        except PreconditionError as e:
            if len(steps) == 1:
                raise
            raise PreconditionError(e.action, f"step {i} of {len(steps)}: {e.reason}") from None
    return settle(_new_transfer(s, SwapOut(tuple(swaps)))) if swaps else s


def _evict_one(s: CacheState, step: EvictStep, swaps: list[tuple[BlockHash, GpuBlock, CpuBlock]]) -> CacheState:
    a, h = "evict", step.node
    require(h in s.nodes, a, f"unknown node {h:#x}")
    tier = s.nodes[h].tier
    on_cpu = isinstance(step, EvictCpu) or (isinstance(step, SkipStale) and step.tier is Tier.CPU)
    heap = s.cpu_heap if on_cpu else s.gpu_heap
    require(h in heap.entries, a, f"node {h:#x} has no entry in the {'CPU' if on_cpu else 'GPU'} heap")
    if isinstance(step, SkipStale):
        evictable = cpu_evictable(s, h) if on_cpu else gpu_evictable(s, h)
        require(not evictable, a, f"node {h:#x} is evictable: its entry is not stale")
    else:
        why = cpu_unevictable(s, h) if isinstance(step, EvictCpu) else gpu_unevictable(s, h)
        require(not why, a, f"node {h:#x} is not evictable on {'CPU' if isinstance(step, EvictCpu) else 'GPU'}: {why}")
    popped = replace(s, cpu_heap=_popped(heap, h)) if on_cpu else replace(s, gpu_heap=_popped(heap, h))
    if isinstance(step, SkipStale):
        return popped
    if isinstance(step, EvictCpu):
        assert isinstance(tier, OnCpu)
        return replace(popped, nodes=_without(s.nodes, h), cpu_free=_give_free(s.cpu_free, [tier.cpu]))
    assert isinstance(tier, OnGpu)
    if isinstance(step, Drop):
        require(not _cpu_has_room(s), a, f"node {h:#x} dropped while the CPU tier has room")
        return replace(popped, nodes=_without(s.nodes, h), gpu_free=_give_free(s.gpu_free, [tier.gpu]))
    swaps.append((h, tier.gpu, step.cpu))
    return replace(
        popped,
        cpu_free=_take_free(s.cpu_free, [step.cpu], a, s.cpu_size),
        nodes=_put(s.nodes, h, replace(s.nodes[h], tier=SwappingOut(tier.gpu, step.cpu))),
        gpu_pins=_bump(s.gpu_pins, tier.gpu, 1),
    )


# --- completion -------------------------------------------------------------------


@_settles
def complete(s: CacheState, t: TransferId, outcome: Outcome) -> CacheState:
    """Transfer t ends with `outcome`. Every outcome unpins what t read and leaves each
    of its nodes in a consistent tier: the done items move, the failed ones stay put."""
    a = "complete"
    require(t in s.transfers, a, f"unknown transfer {t}")
    tr = s.transfers[t]
    if isinstance(outcome, Partial):
        require(0 <= outcome.done <= len(tr.items), a, f"partial({outcome.done}) of {len(tr.items)} items")
    done = succeeded(outcome, len(tr.items))
    s = replace(s, transfers=_without(s.transfers, t))
    if isinstance(tr, SwapOut):
        return _complete_swap_out(s, tr, done)
    if isinstance(tr, SwapIn):
        return _complete_swap_in(s, tr, done)
    if isinstance(tr, StorageWrite):
        pins = dict(s.gpu_pins)
        for _, g in tr.items:
            pins = _bump(pins, g, -1)
        return replace(
            s,
            gpu_pins=pins,
            stored=s.stored | {h for h, _ in tr.items[:done]},
            gpu_free=_give_free(s.gpu_free, tr.adopted),
        )
    if tr.request is None:
        return replace(s, gpu_free=_give_free(s.gpu_free, [g for _, g in tr.items]))
    return s  # prefetched blocks stay private to the request, filled or not


def _complete_swap_out(s: CacheState, tr: SwapOut, done: int) -> CacheState:
    nodes, pins = dict(s.nodes), dict(s.gpu_pins)
    gpu_back: list[GpuBlock] = []
    cpu_back: list[CpuBlock] = []
    for i, (h, g, c) in enumerate(tr.items):
        pins = _bump(pins, g, -1)
        if i < done:
            nodes[h] = replace(nodes[h], tier=OnCpu(c))
            gpu_back.append(g)
        else:
            nodes[h] = replace(nodes[h], tier=OnGpu(g))
            cpu_back.append(c)
    return replace(
        s,
        nodes=nodes,
        gpu_pins=pins,
        gpu_free=_give_free(s.gpu_free, gpu_back),
        cpu_free=_give_free(s.cpu_free, cpu_back),
    )


def _complete_swap_in(s: CacheState, tr: SwapIn, done: int) -> CacheState:
    nodes, pins = dict(s.nodes), dict(s.cpu_pins)
    cpu_back: list[CpuBlock] = []
    failed_gpu: list[GpuBlock] = []
    for i, (h, c, g) in enumerate(tr.items):
        pins = _bump(pins, c, -1)
        if i < done:
            nodes[h] = replace(nodes[h], tier=OnGpu(g))
            cpu_back.append(c)
        else:
            nodes[h] = replace(nodes[h], tier=OnCpu(c))
            failed_gpu.append(g)
    s = replace(s, nodes=nodes, cpu_pins=pins, cpu_free=_give_free(s.cpu_free, cpu_back))
    if not failed_gpu:
        return s
    if tr.request is None:
        return replace(s, gpu_free=_give_free(s.gpu_free, failed_gpu))
    # The request keeps its table length: the failed blocks become private, to be
    # recomputed, and the path is cut before the first node that did not arrive.
    held = s.requests[tr.request]
    cut = len(held.path) - (len(tr.items) - done)
    return replace(
        s,
        nodes=_adjust_ref(s.nodes, held.path[cut:], -1),
        requests=_put(s.requests, tr.request, Holding(held.path[:cut], tuple(failed_gpu) + held.private)),
    )


# --- reset ----------------------------------------------------------------------


@_settles
def reset(s: CacheState) -> CacheState:
    """From quiescence (no live request): every transfer ends as a timeout, then the
    tree is emptied and every block is free. What storage holds survives."""
    a = "reset"
    require(not s.requests, a, f"requests {sorted(s.requests)} are live")
    for t in sorted(s.transfers):
        s = complete(s, t, Timeout())
    return replace(
        s,
        nodes={},
        gpu_free=tuple(GpuBlock(g) for g in range(s.gpu_size)),
        cpu_free=tuple(CpuBlock(c) for c in range(s.cpu_size)),
    )


# --- the actions as data: what an implementation reports, and a checker replays ----------


@dataclass(frozen=True)
class Match:
    request: RequestId
    hashes: tuple[BlockHash, ...]
    swap_dests: tuple[GpuBlock, ...] = ()
    prefetch_dests: tuple[GpuBlock, ...] = ()
    limit: int | None = None  # the GPU blocks the caller allowed the two (None: as many as are free)


@dataclass(frozen=True)
class Allocate:
    request: RequestId
    blocks: tuple[GpuBlock, ...]
    asked: int | None = None  # the caller's count, where it gave one


@dataclass(frozen=True)
class Commit:
    request: RequestId
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True)
class Release:
    request: RequestId
    writes: tuple[tuple[BlockHash, GpuBlock], ...] = ()


@dataclass(frozen=True)
class Evict:
    steps: tuple[EvictStep, ...]


@dataclass(frozen=True)
class Complete:
    transfer: TransferId
    outcome: Outcome


@dataclass(frozen=True)
class Reset:
    pass


CacheEvent = Match | Allocate | Commit | Release | Evict | Complete | Reset


def apply_cache(s: CacheState, e: CacheEvent) -> CacheState:
    """The cache action an event names, with the choices it carries."""
    if isinstance(e, Match):
        return match(s, e.request, e.hashes, e.swap_dests, e.prefetch_dests, e.limit)
    if isinstance(e, Allocate):
        return allocate(s, e.request, e.blocks, e.asked)
    if isinstance(e, Commit):
        return commit(s, e.request, e.hashes)
    if isinstance(e, Release):
        return release(s, e.request, e.writes)
    if isinstance(e, Evict):
        return evict(s, e.steps)
    if isinstance(e, Complete):
        return complete(s, e.transfer, e.outcome)
    return reset(s)
