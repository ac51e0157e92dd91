"""The mutant catalogue: one deliberately broken variant per bug class of the design.

Each mutant is a subclass that overrides one small method of the reference, so the
reference stays free of switches. `kvoracle check --mutant NAME` and the tests
select them by name. A mutant that survives the machines is a failing test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvoracle.kvcache.allocator import BlockAllocator
from kvoracle.kvcache.lru import LeafHeap
from kvoracle.kvcache.manager import CacheManager, Completion, EvictReport, Holding, ReleaseReport
from kvoracle.kvcache.faults import Reply
from kvoracle.kvcache.errors import OutOfBlocks
from kvoracle.kvcache.transfers import Job, PrefetchJob, SwapInJob, SwapOutJob, WriteJob
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.actions import Evict
from kvoracle.spec.state import Status
from kvoracle.spec.types import Outcome, TransferId
from kvoracle.kvcache.tree import GPU, Node
from kvoracle.spec.types import BlockHash, CpuBlock, GpuBlock, OnGpu, RequestId


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: int
    summary: str
    mutation: str
    kills: frozenset[str]  # property IDs whose violation counts as the kill
    cache_class: type[CacheManager] = CacheManager
    scheduler_class: type[ResourceManager] | None = None  # set: a scheduler-level mutant
    bookkeeping: bool = True  # False: the machine checks INV-CONTENT alone
    cpu_blocks: int | None = None  # set: the cache machine's CPU tier has this many blocks
    on_disk: bool = False  # True: a scheduler-level mutant run over the storage tier on disk (reference-disk)
    # False: only the engine's report of its own steps (REFINEMENT on the record) shows it,
    # so an engine observed as a black box (no state(), no events()) cannot be held to it
    observable: bool = True

    @property
    def level(self) -> str:
        return "cache" if self.scheduler_class is None else "scheduler"


# --- 1: shared node popped from the LRU heap and dropped (FastDeploy's dropped heap node, fixed by PR 7807) -------


class ForgetfulHeap(LeafHeap):
    def _drop_stale(self, node: Node) -> None:
        pass  # popped and dropped, but the node still counts as "in the heap": never offered again


class HeapDrop(CacheManager):
    heap_class = ForgetfulHeap


class UntrackedParent(CacheManager):
    """A leaf dropped by eviction leaves its parent a leaf, never offered to the GPU heap."""

    def _drop(self, node: Node) -> None:
        assert isinstance(node.tier, OnGpu)
        g = node.tier.gpu
        with self._tracking(node):  # the parent is left out of the tracking
            self.tree.remove_leaf(node)
        self.gpu.free([g])


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
            self._move_refs([n], -1, self._tick())
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
        if h in self.tree.by_hash:
            if not self.gpu.is_free(held.private[0]):
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


# --- 10: a fill that delivered nothing is waited for forever ------------------------------------


class StuckFill(CacheManager):
    """A swap-in or prefetch that ends with nothing delivered is not counted as ended."""

    def complete(self, t: TransferId, outcome: Outcome) -> Completion:
        ended = super().complete(t, outcome)
        job = ended.job
        if isinstance(job, SwapInJob | PrefetchJob) and job.request is not None and ended.done == 0:
            self.requests[job.request].filling += 1  # still "filling", with nothing in flight
        return ended


CACHE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("heap-drop", 1, "Shared node popped from the LRU heap and dropped: FastDeploy's dropped heap node",
           "LeafHeap._drop_stale keeps the node's in_heap flag",
           frozenset({"INV-HEAP-SOUND", "INV-HEAP-COMPLETE"}), HeapDrop),
    Mutant("untracked-parent", 1, "A dropped leaf's parent, now a leaf itself, is never offered to the heap",
           "CacheManager._drop tracks the dropped node but not its parent",
           frozenset({"INV-HEAP-COMPLETE"}), UntrackedParent, cpu_blocks=1),
    Mutant("double-free", 4, "Double free accepted",
           "BlockAllocator.free skips validation", frozenset({"INV-CONSERVE"}), DoubleFreeAccepted),
    Mutant("double-unlock", 5, "Refcount underflow: unlocking twice",
           "release of a released request drops its path's refcounts again",
           # the refcounts of the tree's nodes go below zero; once a reset has taken the path
           # out of the tree, the second unlock shows only in the evictable count it drives
           frozenset({"INV-REFCOUNT", "INV-COUNTERS"}), DoubleUnlock),
    Mutant("counter-drift", 6, "Evictable counter disagrees with the structures",
           "a node re-shared by a match stays counted as evictable", frozenset({"INV-COUNTERS"}), CounterDrift),
    Mutant("cross-tier", 7, "GPU id pushed into the CPU free list",
           "a finished swap-in frees its GPU id to the CPU free list",
           # a GPU id past the CPU pool's end, once handed out, makes the next copy into it raise
           frozenset({"INV-TIER", "INV-CONSERVE", "VALID-INPUT"}), CrossTier),
    Mutant("duplicate-overwrite", 8, "Duplicate hash overwrites an existing child",
           "commit inserts without looking for an existing child", frozenset({"INV-TREE", "INV-CONSERVE"}),
           DuplicateOverwrite),  # the child it replaced is detached, its block owned by nobody
    Mutant("recycle-listed", 9, "Block recycled while a request's table lists it",
           "on a hash collision commit frees the request's block but keeps it listed", frozenset({"INV-NO-UAF"}), RecycleListed),
    Mutant("wedged-eviction", 12, "A failed transfer leaves eviction wedged",
           "a failed swap-out is stored and re-raised by every later eviction", frozenset({"LIVE-EVICT"}), WedgedEviction),
    Mutant("stuck-fill", 10, "A fill that delivered nothing is waited for forever",
           "a swap-in or prefetch that fails outright leaves its request not ready, with nothing in flight",
           frozenset({"REFINEMENT"}), StuckFill),
)



# --- 2: storage write raises, free skipped (FastDeploy PR 7807, "free blocks even if AS write failed") -----------------------


class _WriteBeforeRelease(ResourceManager):
    """Writes synchronously before releasing, without catching: a raise skips the free.
    Only once the request's blocks are filled (ready), so that the bytes it writes are
    right and the only bug is the skipped free."""

    synchronous_on: tuple[Status, ...] = ()

    def _exit(self, r: RequestId, to: Status) -> None:
        req = self.requests[r]
        if (to in self.synchronous_on and req.status is Status.RUNNING and self.write_policy.writes_on(to)
                and self.cache.ready(r)):
            writes = list(zip(self.hashes(r)[: req.blocks], self.cache.table(r)))
            self.storage.write(self._payloads(writes))  # raises: nothing below runs
            self._release(r, to, ())
            return
        super()._exit(r, to)


class WriteRaiseOnFinish(_WriteBeforeRelease):
    synchronous_on = (Status.FINISHED,)


class WriteRaiseOnPreempt(_WriteBeforeRelease):
    synchronous_on = (Status.PREEMPTED,)


class WriteRaiseStopsBatch(ResourceManager):
    """Releases each request right, but re-raises its write error, ending the batch loop."""

    def _exit(self, r: RequestId, to: Status) -> None:
        raised = self.stats.io_raised
        super()._exit(r, to)
        if self.stats.io_raised > raised:
            raise RuntimeError(self.stats.log[-1])


# --- 3: leak on a failed admit after a partial match ----------------------------------------


class LeakyAdmit(ResourceManager):
    def _admit(self, r: RequestId) -> bool:
        req = self.requests[r]
        hashes = self.hashes(r)
        blocks = self.blocks_for(len(req.tokens))
        rep = self.cache.match(r, hashes)  # references taken, fills started, before knowing it fits
        try:
            self.cache.allocate(r, blocks - len(self.cache.table(r)))
        except OutOfBlocks:
            return False  # ... and never given back
        self._started_running(req, blocks, rep)
        self._fill(r, range(rep.hits, blocks))
        self._start_fills(r, rep)
        return True


# --- 10: a transfer that never answers is waited for forever ---------------------------------


class NoTimeout(ResourceManager):
    def _expire(self) -> None:
        pass


class LateTimeout(ResourceManager):
    def _expire(self) -> None:
        self.timeout += 1  # `>` for `>=`: what has run for `timeout` ticks waits one more
        try:
            super()._expire()
        finally:
            self.timeout -= 1


class DriftingClock(ResourceManager):
    """The eighteenth blind run's plant: a scheduling step that must wait for its swap-out
    lets a tick pass (`tick()` for `tick(0)`), so the scheduler's clock runs ahead of the
    caller's and its transfers time out early."""

    _in_evict = False

    def tick(self, n: int = 1) -> None:
        super().tick(1 if n == 0 and self._in_evict else n)

    def _evict(self, need: int) -> bool:
        self._in_evict = True
        try:
            return super()._evict(need)
        finally:
            self._in_evict = False


# --- 11: a late completion frees blocks that were reused ----------------------------------------


class LateFree(ResourceManager):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sources: dict[TransferId, list[GpuBlock]] = {}

    def _start(self, t: TransferId, io: Callable[[], Reply]) -> None:
        job = self.cache.jobs.get(t)
        if isinstance(job, WriteJob | PrefetchJob):
            self._sources[t] = [g for _, g in job.items]
        super()._start(t, io)

    def _deliver(self, t: TransferId, outcome: Outcome) -> None:
        if t not in self.cache.jobs:  # "cleanup" for a transfer that already ended
            busy = [g for g in self._sources.get(t, []) if not self.cache.gpu.is_free(g)]
            self.cache.gpu.free(busy)
            return
        super()._deliver(t, outcome)


# --- 13: admission that starves (beyond the design's twelve: the second blind run planted it) ---


class StarvingAdmit(ResourceManager):
    def _fits(self, need: int) -> bool:
        return need < self.cache.gpu.num_free  # one block short: a request that needs all that is free waits


# --- 14: a needless preemption (beyond the design's twelve: the ninth blind run planted it) ---


class SelfPreempt(ResourceManager):
    def _reserve(self, need: int, grower: RequestId) -> bool:
        while self.cache.gpu.num_free <= need:  # one block too strict: exactly enough free is not enough
            if self._evict(need - self.cache.gpu.num_free):
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim == grower:
                return False
        return True


# --- 15: a copy told the wrong batch (beyond the design's twelve: the ninth blind run planted it) ---


class MiscountedSwap(ResourceManager):
    def _evict(self, need: int) -> bool:
        rep = self.cache.evict_gpu(need)
        self.stats.block_ops += len(rep.steps)
        if rep.steps:
            self.events.append(Evict(rep.steps))
        if rep.swap_out is not None:
            n = len(rep.steps)  # every eviction step, drops and stale entries too, not the swap-out's items
            self._start(rep.swap_out, lambda: self.copier.copy("swap_out", n))
            if self.cache.gpu.num_free < need:
                self.tick(0)
        return bool(rep.steps)


# --- 16: a payload of the wrong size counted as arrived (beyond the design's twelve: the sixteenth blind run) ---


class KeptWrongSize(ResourceManager):
    def _move(self, job: Job, done: int) -> int:
        super()._move(job, done)
        return done  # every item the answer counts, a prefetched payload that fit no block included, is not recomputed


SCHEDULER_MUTANTS: tuple[Mutant, ...] = (
    Mutant("write-raise-finish", 2, "Storage write raises on finish, free skipped (FastDeploy PR 7807)",
           "finish writes synchronously before release and lets the error escape",
           # the blocks kept after the exit (LIVE-EXIT), or the error escaping a valid call
           # first, where the write ran inside another call (VALID-INPUT)
           frozenset({"LIVE-EXIT", "VALID-INPUT"}), scheduler_class=WriteRaiseOnFinish),
    Mutant("write-raise-preempt", 2, "Storage write raises on preempt, free skipped (FastDeploy PR 7807)",
           "preempt writes synchronously before release and lets the error escape",
           frozenset({"LIVE-EXIT", "VALID-INPUT"}), scheduler_class=WriteRaiseOnPreempt),
    Mutant("write-raise-batch", 2, "One failing write stops the rest of a finish batch",
           "a write error is re-raised after its own request's release, ending the batch loop",
           # the error escaping finish is itself a violation (VALID-INPUT); the requests
           # of the batch it stopped before keep their blocks (LIVE-EXIT)
           frozenset({"LIVE-EXIT", "VALID-INPUT"}), scheduler_class=WriteRaiseStopsBatch),
    Mutant("leaky-admit", 3, "Leak on a failed admit after a partial match",
           "admit matches (refcounts, fills) before checking the rest fits, and keeps them on failure",
           # a waiting request holds blocks (INV-REQUEST); when the failed admit is a
           # preempted request's re-admission, the preempted request holds them (LIVE-EXIT)
           frozenset({"INV-REQUEST", "LIVE-EXIT"}), scheduler_class=LeakyAdmit),
    Mutant("no-timeout", 10, "A transfer that never completes is waited for forever",
           "the scheduler's timeout never fires", frozenset({"LIVE-TRANSFER"}), scheduler_class=NoTimeout),
    Mutant("late-timeout", 10, "A transfer that reaches its timeout on a tick is timed out a tick later",
           "the scheduler's expiry compares a transfer's age with > where it means >=", frozenset({"LIVE-TRANSFER"}),
           scheduler_class=LateTimeout),
    Mutant("drifting-clock", 10, "A scheduling step lets time pass, so transfers time out early",
           "an eviction round that waits for its swap-out ticks the clock once (tick() for tick(0)): the "
           "scheduler's clock runs ahead of its caller's", frozenset({"REFINEMENT"}), scheduler_class=DriftingClock,
           observable=False),
    Mutant("starving-admit", 13, "Admission that starves: a request that needs every free block waits forever",
           "admission asks for one block more than the request needs", frozenset({"LIVE-ADMIT"}),
           scheduler_class=StarvingAdmit),
    Mutant("self-preempt", 14, "A request that fits preempts itself for ever, never growing",
           "decode's room check asks for one free block more than it takes", frozenset({"LIVE-PROGRESS"}),
           scheduler_class=SelfPreempt),
    Mutant("miscounted-swap", 15, "A swap-out's copy is told the wrong number of blocks",
           "the copier is asked for every eviction step, not the items the swap-out moves",
           frozenset({"VALID-INPUT", "REFINEMENT"}), scheduler_class=MiscountedSwap),
    Mutant("kept-wrong-size", 16, "A prefetched payload of the wrong size is kept as if it arrived",
           "a prefetch counts every block the storage answered as landed, one whose payload fits no block (written "
           "by a deployment with another layout) included, so it is never computed again", frozenset({"INV-CONTENT"}),
           scheduler_class=KeptWrongSize, on_disk=True),
    Mutant("late-free", 11, "A late or duplicate completion frees a reused block",
           "an answer for an ended transfer frees that transfer's blocks again",
           frozenset({"INV-NO-UAF", "INV-CONSERVE"}), scheduler_class=LateFree),
)
CONTENT_MUTANTS: tuple[Mutant, ...] = (
    Mutant("recycle-listed-content", 9, "Block recycled while listed, seen through the KV bytes alone",
           "recycle-listed's commit, with every bookkeeping check of the machine switched off",
           frozenset({"INV-CONTENT"}), RecycleListed, ResourceManager, bookkeeping=False),
)
MUTANTS: tuple[Mutant, ...] = CACHE_MUTANTS + SCHEDULER_MUTANTS + CONTENT_MUTANTS


def by_name(name: str) -> Mutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    known = ", ".join(m.name for m in MUTANTS)
    raise KeyError(f"no mutant named {name!r}; known: {known}")
