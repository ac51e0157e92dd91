"""The mutant catalogue: one deliberately broken variant per bug class of the design.

Each mutant is a subclass that overrides one small method of the reference, so the
reference stays free of switches. `kvoracle check --mutant NAME` and the tests
select them by name. A mutant that survives the machines is a failing test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvcache.allocator import BlockAllocator
from kvcache.lru import LeafHeap
from kvcache.manager import CacheManager, EvictReport, Holding, ReleaseReport
from kvcache.transfers import SwapOutJob
from kvcache.tree import GPU, Node
from spec.types import BlockHash, CpuBlock, GpuBlock, OnGpu, RequestId


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: int
    summary: str
    mutation: str
    kills: frozenset[str]  # property IDs whose violation counts as the kill
    cache_class: type[CacheManager]


# --- 1: shared node popped from the LRU heap and dropped (FastDeploy seed bug a) -------


class ForgetfulHeap(LeafHeap):
    def _drop_stale(self, node: Node) -> None:
        pass  # popped and dropped, but the node still counts as "in the heap": never offered again


class HeapDrop(CacheManager):
    heap_class = ForgetfulHeap


# --- 4: double free accepted -----------------------------------------------------------


class TrustingAllocator(BlockAllocator[GpuBlock]):
    def free(self, blocks: Sequence[GpuBlock]) -> None:
        self._release(blocks)  # no check: a free block goes on the free list twice


class DoubleFreeAccepted(CacheManager):
    gpu_allocator_class = TrustingAllocator


# --- 5: refcount underflow: unlocking twice --------------------------------------------


class DoubleUnlock(CacheManager):
    """Validates after acting: a second release drops the path's locks again, then refuses."""

    def __init__(self, gpu_blocks: int, cpu_blocks: int = 0) -> None:
        super().__init__(gpu_blocks, cpu_blocks)
        self._unlocked: dict[RequestId, list[Node]] = {}

    def release(self, r: RequestId, write: Sequence[BlockHash] = ()) -> ReleaseReport:
        for n in self._unlocked.get(r, []) if r not in self.requests else []:
            self._drop_ref(n, self._tick())
        held = self._holding(r)
        self._unlocked[r] = list(held.path)
        return super().release(r, write)


# --- 6: counter drift ------------------------------------------------------------------


class CounterDrift(CacheManager):
    def _settle(self, n: Node, tier: int, was: bool, now: bool) -> None:
        if tier == GPU and was and not now and n.refcount > 0:
            return  # a re-shared node leaves the evictable count unchanged
        super()._settle(n, tier, was, now)


# --- 7: GPU id pushed into the CPU free list -------------------------------------------


class CrossTier(CacheManager):
    def _vacate_cpu(self, c: CpuBlock, g: GpuBlock) -> None:
        self.cpu._release([CpuBlock(g)])  # the GPU id lands on the CPU free list


# --- 8: duplicate hash overwrites an existing child --------------------------------------


class DuplicateOverwrite(CacheManager):
    def _insert(self, held: Holding, parent: Node, h: BlockHash, now: int) -> bool:
        with self._tracking(parent):  # no lookup first: the new node replaces the cached child
            node = self.tree.add_child(parent, h, OnGpu(held.private.pop(0)))
        node.refcount = 1
        node.last_access = now
        held.path.append(node)
        return True


# --- 9: block recycled while a request's table still lists it ------------------------------


class RecycleListed(CacheManager):
    def _insert(self, held: Holding, parent: Node, h: BlockHash, now: int) -> bool:
        if h in parent.children:
            self.gpu.free([held.private[0]])  # "the tree has it already" - but r still lists it
            return False
        return super()._insert(held, parent, h, now)


# --- 12: a failed transfer wedges eviction -------------------------------------------------


class WedgedEviction(CacheManager):
    def __init__(self, gpu_blocks: int, cpu_blocks: int = 0) -> None:
        super().__init__(gpu_blocks, cpu_blocks)
        self._failure: str | None = None

    def _finish_swap_out(self, job: SwapOutJob, done: int) -> None:
        super()._finish_swap_out(job, done)
        if done < len(job.items):
            self._failure = f"swap-out {job.id} failed"  # stored, and re-raised forever

    def evict_gpu(self, need: int) -> EvictReport:
        if self._failure is not None:
            raise RuntimeError(self._failure)
        return super().evict_gpu(need)


CACHE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("heap-drop", 1, "Shared node popped from the LRU heap and dropped (seed bug a)",
           "LeafHeap._drop_stale keeps the node's in_heap flag",
           frozenset({"INV-HEAP-SOUND", "INV-HEAP-COMPLETE"}), HeapDrop),
    Mutant("double-free", 4, "Double free accepted",
           "BlockAllocator.free skips validation", frozenset({"INV-CONSERVE"}), DoubleFreeAccepted),
    Mutant("double-unlock", 5, "Refcount underflow: unlocking twice",
           "release of a released request drops its path's refcounts again", frozenset({"INV-REFCOUNT"}), DoubleUnlock),
    Mutant("counter-drift", 6, "Evictable counter disagrees with the structures",
           "a node re-shared by a match stays counted as evictable", frozenset({"INV-COUNTERS"}), CounterDrift),
    Mutant("cross-tier", 7, "GPU id pushed into the CPU free list",
           "a finished swap-in frees its GPU id to the CPU free list", frozenset({"INV-TIER", "INV-CONSERVE"}), CrossTier),
    Mutant("duplicate-overwrite", 8, "Duplicate hash overwrites an existing child",
           "commit inserts without looking for an existing child", frozenset({"INV-TREE"}), DuplicateOverwrite),
    Mutant("recycle-listed", 9, "Block recycled while a request's table lists it",
           "on a hash collision commit frees the request's block but keeps it listed", frozenset({"INV-NO-UAF"}), RecycleListed),
    Mutant("wedged-eviction", 12, "A failed transfer leaves eviction wedged",
           "a failed swap-out is stored and re-raised by every later eviction", frozenset({"LIVE-EVICT"}), WedgedEviction),
)


def by_name(name: str) -> Mutant:
    for m in CACHE_MUTANTS:
        if m.name == name:
            return m
    known = ", ".join(m.name for m in CACHE_MUTANTS)
    raise KeyError(f"no mutant named {name!r}; known: {known}")
