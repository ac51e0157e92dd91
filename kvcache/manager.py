"""The reference cache manager: the efficient, mutable shell around spec/.

Every public method either raises a KVCacheError and changes nothing, or applies
one spec action and reports the choices it made (which blocks, which nodes), so
that refinement can replay the action on the abstract state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvoracle.kvcache.allocator import B, BlockAllocator
from kvoracle.kvcache.errors import (
    DuplicateRequest,
    HashMismatch,
    InvalidLimit,
    InvalidOutcome,
    NotQuiescent,
    NotReady,
    OutOfBlocks,
    UnknownRequest,
    UnknownTransfer,
)
from kvoracle.kvcache.lru import LeafHeap
from kvoracle.kvcache.transfers import Job, PrefetchJob, SwapInJob, SwapOutJob, WriteJob
from kvoracle.kvcache.tree import CPU, GPU, Node, RadixTree
from kvoracle.spec.actions import Drop, EvictCpu, EvictStep, SkipStale, SwapOutTo
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
    succeeded,
)

_LISTED = (OnGpu, SwappingIn, SwappingOut)  # tiers a table lists; a tuple is isinstance's fast path


@dataclass
class Holding:
    path: list[Node]
    private: list[GpuBlock]
    filling: int = 0  # swap-ins and prefetches still filling this request's table


class MatchReport(NamedTuple):  # NamedTuples, not frozen dataclasses: built on every call, they cost less
    gpu_hits: int
    swap_dests: tuple[GpuBlock, ...]
    prefetch_dests: tuple[GpuBlock, ...]
    swap_in: TransferId | None
    prefetch: TransferId | None

    @property
    def hits(self) -> int:
        return self.gpu_hits + len(self.swap_dests) + len(self.prefetch_dests)


class ReleaseReport(NamedTuple):
    writes: tuple[tuple[BlockHash, GpuBlock], ...]
    write: TransferId | None


class EvictReport(NamedTuple):
    steps: tuple[EvictStep, ...]
    swap_out: TransferId | None


class Completion(NamedTuple):
    job: Job
    done: int  # leading items that succeeded


class _Tracking:
    """CacheManager._tracking's context (a class: a generator-based one costs more on
    the hot paths). On an exception nothing is settled, as for any failed mutation."""

    __slots__ = ("manager", "before")

    def __init__(self, manager: CacheManager, nodes: tuple[Node | None, ...]) -> None:
        self.manager = manager
        self.before: list[tuple[Node, bool, bool]] = []
        for n in nodes:  # one or two nodes: a scan beats a set
            if n is None or n.parent is None:  # the root holds no block
                continue
            for seen, _, _ in self.before:
                if seen is n:
                    break
            else:
                self.before.append((n, manager.is_gpu_evictable(n), manager.is_cpu_evictable(n)))

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            return
        m = self.manager
        for n, was_gpu, was_cpu in self.before:
            now_gpu = n.alive and m.is_gpu_evictable(n)
            if now_gpu != was_gpu:
                m._settle(n, GPU, was_gpu, now_gpu)
            now_cpu = n.alive and m.is_cpu_evictable(n)
            if now_cpu != was_cpu:
                m._settle(n, CPU, was_cpu, now_cpu)


class CacheManager:
    """GPU and CPU block pools, the prefix tree, LRU leaf heaps and in-flight transfers."""

    heap_class = LeafHeap
    gpu_allocator_class: type[BlockAllocator[GpuBlock]] = BlockAllocator
    cpu_allocator_class: type[BlockAllocator[CpuBlock]] = BlockAllocator

    def __init__(self, gpu_blocks: int, cpu_blocks: int = 0) -> None:
        self.gpu = self.gpu_allocator_class("GPU", gpu_blocks, GpuBlock)
        self.cpu = self.cpu_allocator_class("CPU", cpu_blocks, CpuBlock)
        self.tree = RadixTree()
        self.gpu_heap = self.heap_class(GPU)
        self.cpu_heap = self.heap_class(CPU)
        self.requests: dict[RequestId, Holding] = {}
        self.jobs: dict[TransferId, Job] = {}
        self.gpu_pins: dict[GpuBlock, int] = {}
        self.cpu_pins: dict[CpuBlock, int] = {}
        self.stored: set[BlockHash] = set()  # hashes whose storage write was confirmed
        self.gpu_evictable = 0  # kept counters (INV-COUNTERS)
        self.cpu_evictable = 0
        self.clock = 0
        self.next_transfer = 0

    # --- evictability, counters and heaps ------------------------------------------

    def is_gpu_evictable(self, n: Node) -> bool:
        t = n.tier
        return (
            isinstance(t, OnGpu) and n.refcount == 0 and n.gpu_children == 0 and not self.gpu_pins.get(t.gpu, 0)
        )

    def is_cpu_evictable(self, n: Node) -> bool:
        t = n.tier
        return isinstance(t, OnCpu) and not n.children and not self.cpu_pins.get(t.cpu, 0)

    def _tracking(self, *nodes: Node | None) -> _Tracking:
        """Around a mutation of these nodes: keep the evictable counters exact and
        offer every node that became evictable to its heap."""
        return _Tracking(self, nodes)

    def _settle(self, n: Node, tier: int, was: bool, now: bool) -> None:
        if was == now:
            return
        if tier == GPU:
            self.gpu_evictable += 1 if now else -1
        else:
            self.cpu_evictable += 1 if now else -1
        if now:
            (self.gpu_heap if tier == GPU else self.cpu_heap).offer(n)

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _new_id(self) -> TransferId:
        t = TransferId(self.next_transfer)
        self.next_transfer += 1
        return t

    @staticmethod
    def _pin(pins: dict[B, int], block: B, by: int) -> None:
        pins[block] = pins.get(block, 0) + by
        if pins[block] == 0:
            del pins[block]

    # --- match -------------------------------------------------------------------

    def _walk_gpu(self, hashes: Sequence[BlockHash]) -> list[Node]:
        path: list[Node] = []
        node = self.tree.root
        for h in hashes:
            child = node.children.get(h)
            if child is None or not isinstance(child.tier, OnGpu):
                break
            path.append(child)
            node = child
        return path

    def gpu_hits(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks are cached on the GPU now (no side effect)."""
        return len(self._walk_gpu(hashes))

    def match(self, r: RequestId, hashes: Sequence[BlockHash], *, limit: int | None = None) -> MatchReport:
        """r takes a reference on its GPU-resident prefix, then starts a swap-in of the
        CPU-resident nodes that follow and a prefetch of the storage hits after those,
        using at most `limit` (default: all free) GPU blocks for the two."""
        if r in self.requests:
            raise DuplicateRequest(r)
        if limit is not None and limit < 0:
            raise InvalidLimit(limit)
        path = self._walk_gpu(hashes)
        budget = self.gpu.num_free if limit is None else min(limit, self.gpu.num_free)
        cpu_run = self._cpu_run(path[-1] if path else self.tree.root, hashes[len(path) :], budget)
        start = len(path) + len(cpu_run)
        fetch: list[BlockHash] = []  # the stored run after them
        for h in hashes[start : start + budget - len(cpu_run)]:
            if h not in self.stored:
                break
            fetch.append(h)
        swap_dests = self.gpu.allocate(len(cpu_run)) if cpu_run else []
        fetch_dests = self.gpu.allocate(len(fetch)) if fetch else []
        now = self._tick()
        self._move_refs(path, +1, now)
        swap = self._start_swap_in(r, cpu_run, swap_dests, now)
        held = self.requests[r] = Holding(path + cpu_run, list(fetch_dests), filling=bool(swap))
        prefetch = None
        if fetch:
            prefetch = self._new_id()
            self.jobs[prefetch] = PrefetchJob(prefetch, r, list(zip(fetch, fetch_dests)))
            held.filling += 1
        return MatchReport(len(path), tuple(swap_dests), tuple(fetch_dests), swap, prefetch)

    def _cpu_run(self, node: Node, hashes: Sequence[BlockHash], budget: int) -> list[Node]:
        run: list[Node] = []
        for h in hashes[:budget]:
            child = node.children.get(h)
            if child is None or not isinstance(child.tier, OnCpu):
                break
            run.append(child)
            node = child
        return run

    def _move_refs(self, nodes: Sequence[Node], by: int, now: int) -> None:
        """Each node's refcount moves by `by`, and it is used at `now`. A refcount decides
        GPU evictability only, so the GPU counter and heap are all that can change (one
        pass for a whole path: this is the hot path of match and release)."""
        evictable = self.is_gpu_evictable
        # only a refcount that leaves or reaches 0 can change evictability
        crossing = [(n, evictable(n)) for n in nodes if n.refcount == 0 or n.refcount == -by]
        for n in nodes:
            n.refcount += by
            n.last_access = now
        for n, before in crossing:
            after = n.alive and evictable(n)
            if after != before:
                self._settle(n, GPU, before, after)

    def _start_swap_in(self, r: RequestId, run: list[Node], dests: list[GpuBlock], now: int) -> TransferId | None:
        if not run:
            return None
        tid = self._new_id()
        items: list[tuple[Node, CpuBlock, GpuBlock]] = []
        for n, g in zip(run, dests):
            assert isinstance(n.tier, OnCpu)
            c = n.tier.cpu
            with self._tracking(n, n.parent):
                self.tree.set_tier(n, SwappingIn(c, g))
                self._pin(self.cpu_pins, c, +1)
            items.append((n, c, g))
        self._move_refs(run, +1, now)  # nodes swapping in are evictable on neither tier
        self.jobs[tid] = SwapInJob(tid, r, items)
        return tid

    # --- allocate, commit ------------------------------------------------------------

    def _holding(self, r: RequestId) -> Holding:
        held = self.requests.get(r)
        if held is None:
            raise UnknownRequest(r)
        return held

    def allocate(self, r: RequestId, n: int) -> list[GpuBlock]:
        """n free blocks join r's private blocks, or OutOfBlocks and nothing changes."""
        held = self._holding(r)
        blocks = self.gpu.allocate(n)
        held.private.extend(blocks)
        return blocks

    def ready(self, r: RequestId) -> bool:
        """No block of r's table is still being filled by a swap-in or a prefetch."""
        return self._holding(r).filling == 0

    def table(self, r: RequestId) -> list[GpuBlock]:
        held = self._holding(r)
        listed: list[GpuBlock] = []
        for n in held.path:
            assert isinstance(n.tier, _LISTED)
            listed.append(n.tier.gpu)
        return listed + held.private

    def commit(self, r: RequestId, hashes: Sequence[BlockHash]) -> int:
        """r's leading full blocks named by `hashes` become tree nodes, up to the first
        hash already cached; returns how many new nodes were made."""
        held = self._holding(r)
        if [n.hash for n in held.path] != list(hashes[: len(held.path)]):
            raise HashMismatch(r, "hashes disagree with the matched path")
        if len(hashes) > len(held.path) + len(held.private):
            raise HashMismatch(r, f"{len(hashes)} hashes for {len(held.path) + len(held.private)} blocks")
        if held.filling:
            raise NotReady(r)
        made = 0
        now = self._tick()
        for h in hashes[len(held.path) :]:
            parent = held.path[-1] if held.path else self.tree.root
            if not self._insert(held, parent, h, now):
                break
            made += 1
        return made

    def _insert(self, held: Holding, parent: Node, h: BlockHash, now: int) -> bool:
        """Move r's next private block into a new child of `parent`; False (and the
        block stays private) when a node with that hash is already cached."""
        if h in self.tree.by_hash:
            return False
        with self._tracking(parent):
            node = self.tree.add_child(parent, h, OnGpu(held.private.pop(0)))
        node.refcount = 1
        node.last_access = now
        held.path.append(node)
        return True

    # --- release ---------------------------------------------------------------------

    def release(self, r: RequestId, write: Sequence[BlockHash] = ()) -> ReleaseReport:
        """Start a storage write of r's leading blocks named by `write` (those not yet
        stored), then release r whatever that write will do: refcounts on its path go
        down, private blocks become free unless a transfer still needs them."""
        held = self._holding(r)
        sources = self._write_sources(r, held, write)
        wid = None
        if sources:
            wid = self._new_id()
            self.jobs[wid] = WriteJob(wid, [(h, g) for h, g, _ in sources], [n for _, _, n in sources])
            for _, g, node in sources:
                with self._tracking(node):
                    self._pin(self.gpu_pins, g, +1)
        self._release_blocks(r, held, wid)
        return ReleaseReport(tuple((h, g) for h, g, _ in sources), wid)

    def _write_sources(
        self, r: RequestId, held: Holding, write: Sequence[BlockHash]
    ) -> list[tuple[BlockHash, GpuBlock, Node | None]]:
        if not write:
            return []
        table = self.table(r)
        if len(write) > len(table):
            raise HashMismatch(r, f"{len(write)} hashes to write for {len(table)} blocks")
        if not self.ready(r):
            return []  # nothing complete to write yet
        nodes: list[Node | None] = [*held.path, *[None] * len(held.private)]
        return [(h, g, n) for h, g, n in zip(write, table, nodes) if h not in self.stored]

    def _release_blocks(self, r: RequestId, held: Holding, wid: TransferId | None) -> None:
        fetching: set[GpuBlock] = set()
        for job in self.jobs.values():
            if isinstance(job, SwapInJob | PrefetchJob) and job.request == r:
                job.request = None
                if isinstance(job, PrefetchJob):
                    fetching.update(g for _, g in job.items)
        self._move_refs(held.path, -1, self._tick())
        freed: list[GpuBlock] = []
        for g in held.private:
            if g in fetching:
                continue
            if self.gpu_pins.get(g, 0) and wid is not None:
                job = self.jobs[wid]
                assert isinstance(job, WriteJob)
                job.adopted.append(g)
            else:
                freed.append(g)
        self.gpu.free(freed)
        del self.requests[r]

    # --- eviction --------------------------------------------------------------------

    def evict_gpu(self, need: int) -> EvictReport:
        """Start evicting up to `need` GPU leaves, least recently used first: each is
        swapped out when the CPU tier has room (after evicting CPU leaves), else dropped."""
        steps: list[EvictStep] = []
        swaps: list[tuple[Node, GpuBlock, CpuBlock]] = []
        for _ in range(need):
            node = self._pop(self.gpu_heap, self.is_gpu_evictable, Tier.GPU, steps)
            if node is None:
                break
            c = self._cpu_room(steps)
            if c is None:
                self._drop(node)
                steps.append(Drop(node.hash))
            else:
                swaps.append(self._swap_out(node, c))
                steps.append(SwapOutTo(node.hash, c))
        tid = None
        if swaps:
            tid = self._new_id()
            self.jobs[tid] = SwapOutJob(tid, swaps)
        return EvictReport(tuple(steps), tid)

    def evict_cpu(self, need: int) -> EvictReport:
        """Evict up to `need` CPU leaves, least recently used first."""
        steps: list[EvictStep] = []
        for _ in range(need):
            if not self._evict_one_cpu(steps):
                break
        return EvictReport(tuple(steps), None)

    def _cpu_room(self, steps: list[EvictStep]) -> CpuBlock | None:
        if not self.cpu.num_free and not self._evict_one_cpu(steps):
            return None
        return self.cpu.allocate(1)[0]

    def _pop(self, heap: LeafHeap, evictable: Callable[[Node], bool], tier: Tier,
             steps: list[EvictStep]) -> Node | None:
        """The next node eviction takes from `heap`; stale entries it pops become steps."""
        stale: list[Node] = []
        node = heap.pop_evictable(evictable, stale)
        if stale:
            steps.extend(SkipStale(n.hash, tier) for n in stale)
        return node

    def _evict_one_cpu(self, steps: list[EvictStep]) -> bool:
        node = self._pop(self.cpu_heap, self.is_cpu_evictable, Tier.CPU, steps)
        if node is None:
            return False
        assert isinstance(node.tier, OnCpu)
        c = node.tier.cpu
        with self._tracking(node, node.parent):
            self.tree.remove_leaf(node)
        self.cpu.free([c])
        steps.append(EvictCpu(node.hash))
        return True

    def _drop(self, node: Node) -> None:
        assert isinstance(node.tier, OnGpu)
        g = node.tier.gpu
        with self._tracking(node, node.parent):
            self.tree.remove_leaf(node)
        self.gpu.free([g])

    def _swap_out(self, node: Node, c: CpuBlock) -> tuple[Node, GpuBlock, CpuBlock]:
        assert isinstance(node.tier, OnGpu)
        g = node.tier.gpu
        with self._tracking(node, node.parent):
            self.tree.set_tier(node, SwappingOut(g, c))
            self._pin(self.gpu_pins, g, +1)
        return node, g, c

    # --- completion ------------------------------------------------------------------

    def complete(self, t: TransferId, outcome: Outcome) -> Completion:
        """Transfer t ends. Every outcome unpins what it read; done items move tier,
        failed ones stay where they were; blocks the transfer owned are returned."""
        job = self.jobs.get(t)
        if job is None:
            raise UnknownTransfer(t)
        if isinstance(outcome, Partial) and not 0 <= outcome.done <= len(job.items):
            raise InvalidOutcome(t, f"partial({outcome.done}) of {len(job.items)} items")
        done = succeeded(outcome, len(job.items))
        del self.jobs[t]
        if isinstance(job, SwapInJob | PrefetchJob) and job.request is not None:
            self.requests[job.request].filling -= 1
        if isinstance(job, SwapOutJob):
            self._finish_swap_out(job, done)
        elif isinstance(job, SwapInJob):
            self._finish_swap_in(job, done)
        elif isinstance(job, WriteJob):
            self._finish_write(job, done)
        elif job.request is None:
            self.gpu.free([g for _, g in job.items])
        return Completion(job, done)

    def _finish_swap_out(self, job: SwapOutJob, done: int) -> None:
        for i, (node, g, c) in enumerate(job.items):
            with self._tracking(node, node.parent):
                self._pin(self.gpu_pins, g, -1)
                self.tree.set_tier(node, OnCpu(c) if i < done else OnGpu(g))
            if i < done:
                self.gpu.free([g])
            else:
                self.cpu.free([c])

    def _finish_swap_in(self, job: SwapInJob, done: int) -> None:
        failed: list[GpuBlock] = []
        for i, (node, c, g) in enumerate(job.items):
            with self._tracking(node, node.parent):
                self._pin(self.cpu_pins, c, -1)
                self.tree.set_tier(node, OnGpu(g) if i < done else OnCpu(c))
            if i < done:
                self._vacate_cpu(c, g)
            else:
                failed.append(g)
        if not failed:
            return
        if job.request is None:
            self.gpu.free(failed)
            return
        # The request keeps its table length: failed blocks turn private (to be
        # recomputed) and its path is cut before the first node that did not arrive.
        held = self.requests[job.request]
        cut = len(held.path) - len(failed)
        self._move_refs(held.path[cut:], -1, self._tick())
        held.path = held.path[:cut]
        held.private[:0] = failed

    def _vacate_cpu(self, c: CpuBlock, g: GpuBlock) -> None:
        """A node now on GPU block g gives back its CPU copy c."""
        self.cpu.free([c])

    def _finish_write(self, job: WriteJob, done: int) -> None:
        for (_, g), node in zip(job.items, job.readers):
            with self._tracking(node):
                self._pin(self.gpu_pins, g, -1)
        self.stored.update(h for h, _ in job.items[:done])
        self.gpu.free(job.adopted)

    # --- reset -----------------------------------------------------------------------

    def reset(self) -> None:
        """From quiescence: time out every transfer, then empty the tree."""
        if self.requests:
            raise NotQuiescent(sorted(self.requests))
        for t in sorted(self.jobs):
            self.complete(t, Timeout())
        for node in reversed(self.tree.walk()):
            tier = node.tier
            with self._tracking(node, node.parent):
                self.tree.remove_leaf(node)
            if isinstance(tier, OnGpu):
                self.gpu.free([tier.gpu])
            elif isinstance(tier, OnCpu):
                self.cpu.free([tier.cpu])

    # --- counters ----------------------------------------------------------------------

    @property
    def gpu_in_use(self) -> int:
        return self.gpu.size - self.gpu.num_free

    def in_flight(self) -> list[TransferId]:
        return sorted(self.jobs)
