"""The reference cache (kvcache.CacheManager, or a mutant of it) behind the tiered-cache
Protocol, call by call, and its observations of each tier."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kvoracle.kvcache.abstraction import abstract, audit, snapshot
from kvoracle.kvcache.errors import (
    BlockOutOfRange,
    DoubleFree,
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
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.transfers import SwapInJob, SwapOutJob, WriteJob
from kvoracle.oracle.engine import NOBODY, BadInput, Observation, Scripted, import_as
from kvoracle.oracle.tiered import Blocks, Matched, Pending
from kvoracle.spec.actions import EvictStep
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import BlockHash, GpuBlock, OnCpu, OnGpu, Outcome, RequestId, SwappingIn, SwappingOut, TransferId



def _transfer_blocks(cache: CacheManager) -> tuple[list[int], list[int], list[int], list[int]]:
    """Blocks in-flight transfers read (GPU, CPU) and own (GPU, CPU): a swap-out reads its
    GPU source and fills a CPU block, a swap-in the reverse, a write reads and owns the
    blocks it took over from a request that ended, a prefetch fills GPU blocks."""
    gpu_reads: list[int] = []
    cpu_reads: list[int] = []
    gpu_owned: list[int] = []
    cpu_owned: list[int] = []
    for job in cache.jobs.values():
        if isinstance(job, SwapOutJob):
            gpu_reads += [g for _, g, _ in job.items]
            cpu_owned += [c for _, _, c in job.items]
        elif isinstance(job, SwapInJob):
            cpu_reads += [c for _, c, _ in job.items]
            gpu_owned += [g for _, _, g in job.items]
        elif isinstance(job, WriteJob):
            gpu_reads += [g for _, g in job.items]
            gpu_owned += job.adopted
        else:
            gpu_owned += [g for _, g in job.items]
    return gpu_reads, cpu_reads, gpu_owned, cpu_owned


def gpu_observation(c: CacheManager, waiting: frozenset[str] | None = None,
                    tokens: Mapping[str, int] | None = None) -> Observation:
    """The GPU tier as observed (`waiting`, `tokens`: what a scheduler above the cache adds)."""
    every = c.tree.walk()
    nodes = [n for n in every if isinstance(n.tier, OnGpu | SwappingOut)]
    block = {n.hash: n.tier.gpu for n in nodes if isinstance(n.tier, OnGpu | SwappingOut)}
    reads, _, owned, _ = _transfer_blocks(c)
    tables = {f"r{r}": tuple(c.table(r)) for r in c.requests}
    listed = {g for table in tables.values() for g in table}
    return Observation(
        ids=range(c.gpu.size),
        free=tuple(c.gpu.free_blocks()),
        evictable=tuple(sorted(block[n.hash] for n in nodes if c.is_gpu_evictable(n))),
        tables=tables,
        cached=frozenset(block.values()),
        refcounts={block[n.hash]: n.refcount for n in nodes},
        counters={
            "gpu.num_free": (c.gpu.num_free, sum(c.gpu.is_free(b) for b in range(c.gpu.size))),
            "gpu_evictable": (c.gpu_evictable, sum(map(c.is_gpu_evictable, every))),
        },
        pinned=frozenset(reads),
        in_flight=tuple(g for g in owned if g not in listed),  # a block a live request lists is its own
        waiting=waiting,
        tokens=tokens,
    )


def cpu_observation(c: CacheManager) -> Observation:
    every = c.tree.walk()
    nodes = [n for n in every if isinstance(n.tier, OnCpu | SwappingIn)]
    _, reads, _, owned = _transfer_blocks(c)
    return Observation(
        ids=range(c.cpu.size),
        free=tuple(c.cpu.free_blocks()),
        evictable=tuple(sorted(n.tier.cpu for n in nodes if isinstance(n.tier, OnCpu) and c.is_cpu_evictable(n))),
        tables={},
        cached=frozenset(n.tier.cpu for n in nodes if isinstance(n.tier, OnCpu | SwappingIn)),
        counters={
            "cpu.num_free": (c.cpu.num_free, sum(c.cpu.is_free(b) for b in range(c.cpu.size))),
            "cpu_evictable": (c.cpu_evictable, sum(map(c.is_cpu_evictable, every))),
        },
        pinned=frozenset(reads),
        in_flight=tuple(owned),
    )


class ReferenceCache(Scripted):
    """CacheManager (or a mutant of it) behind the tiered-cache Protocol. Each call runs
    from its source text (oracle.engine.Scripted), so a finding replays as a file."""

    name = "reference"
    block_size = 2
    gpu_blocks = 6
    cpu_blocks = 3
    cache_class: type[CacheManager] = CacheManager
    refusals: Mapping[BadInput, type[Exception]] = {
        BadInput.DOUBLE_FREE: DoubleFree,
        BadInput.REPEATED_FREE: DoubleFree,
        BadInput.OUT_OF_RANGE: BlockOutOfRange,
        BadInput.WRONG_TIER: BlockOutOfRange,
        BadInput.DOUBLE_FINISH: UnknownRequest,
        BadInput.UNKNOWN_REQUEST: UnknownRequest,
        BadInput.UNKNOWN_TRANSFER: UnknownTransfer,
        BadInput.BAD_PARTIAL: InvalidOutcome,
        BadInput.DUPLICATE_REQUEST: DuplicateRequest,
        BadInput.HASH_MISMATCH: HashMismatch,
        BadInput.TOO_MANY: OutOfBlocks,
        BadInput.BUSY_RESET: NotQuiescent,
        BadInput.NEGATIVE_LIMIT: InvalidLimit,
        BadInput.COMMIT_FILLING: NotReady,
        BadInput.WRITE_TOO_MANY: HashMismatch,
    }

    def __init__(self) -> None:
        self.preamble = "\n".join([
            "from kvoracle.spec.types import Error, Ok, Partial, Timeout",
            import_as(self.cache_class, "Cache"),
            "",
            f"cache = Cache({self.gpu_blocks}, {self.cpu_blocks})",
        ])
        super().__init__()

    def given(self) -> dict[str, object]:
        return {"Cache": self.cache_class}

    def bind(self) -> None:
        cache = self.namespace["cache"]
        assert isinstance(cache, CacheManager)
        self.cache = cache

    def free_gpu(self) -> int:
        return self.cache.gpu.num_free

    def gpu_hits(self, prompt: Blocks) -> int:
        return self.cache.gpu_hits(prompt.hashes)

    def ready(self, r: RequestId) -> bool:
        return self.cache.ready(r)

    def table(self, r: RequestId) -> tuple[GpuBlock, ...]:
        return tuple(self.cache.table(r))

    def in_flight(self) -> list[Pending]:
        return [Pending(t, len(self.cache.jobs[t].items)) for t in self.cache.in_flight()]

    def cached(self) -> int:
        return self.cache.tree.size

    def match(self, r: RequestId, prompt: Blocks, limit: int) -> Matched:
        rep = self.run(f"_ = cache.match({r}, {prompt.hashes!r}, limit={limit})")
        return Matched(rep.swap_dests, rep.prefetch_dests)

    def allocate(self, r: RequestId, n: int) -> tuple[GpuBlock, ...]:
        return tuple(self.run(f"_ = cache.allocate({r}, {n})"))

    def commit(self, r: RequestId, full: Blocks) -> None:
        self.run(f"cache.commit({r}, {full.hashes!r})")

    def release(self, r: RequestId, write: Blocks) -> tuple[tuple[BlockHash, GpuBlock], ...]:
        writes: tuple[tuple[BlockHash, GpuBlock], ...] = self.run(f"_ = cache.release({r}, {write.hashes!r})").writes
        return writes

    def evict_gpu(self, n: int) -> tuple[EvictStep, ...]:
        steps: tuple[EvictStep, ...] = self.run(f"_ = cache.evict_gpu({n})").steps
        return steps

    def evict_cpu(self, n: int) -> tuple[EvictStep, ...]:
        steps: tuple[EvictStep, ...] = self.run(f"_ = cache.evict_cpu({n})").steps
        return steps

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        self.run(f"cache.complete({t}, {outcome!r})")

    def reset(self) -> None:
        self.run("cache.reset()")

    def bad_call(self, kind: BadInput, r: RequestId | None) -> bool:
        call = self._bad_calls(r).get(kind)
        if call is None:
            return False
        self.run_bad(call())
        return True

    def _bad_calls(self, r: RequestId | None) -> dict[BadInput, Callable[[], str]]:
        """The bad calls that apply in this state, as source text made when called (`r`:
        the request the kind is about, as the machine knows it: a request the engine
        should have forgotten is still tried)."""
        c = self.cache
        calls: dict[BadInput, Callable[[], str]] = {
            BadInput.OUT_OF_RANGE: lambda: f"cache.gpu.free([{c.gpu.size}])",
            BadInput.WRONG_TIER: lambda: f"cache.cpu.free([{c.gpu.size - 1}])",
            BadInput.UNKNOWN_REQUEST: lambda: f"cache.commit({NOBODY}, ())",
            BadInput.UNKNOWN_TRANSFER: lambda: f"cache.complete({NOBODY}, Ok())",
            BadInput.NEGATIVE_LIMIT: lambda: f"cache.match({NOBODY}, (), limit=-1)",
        }
        filling = [q for q in sorted(c.requests) if not c.ready(q)]
        if filling:  # a swap-in or prefetch of its blocks has not ended
            calls[BadInput.COMMIT_FILLING] = lambda: f"cache.commit({filling[0]}, {self._prefix(filling[0])!r})"
        if c.gpu.num_free:
            calls[BadInput.DOUBLE_FREE] = lambda: f"cache.gpu.free([{c.gpu.free_blocks()[-1]}])"
        if c.gpu.num_free < c.gpu.size:  # each half of the batch alone would be a valid free
            used = next(b for b in range(c.gpu.size) if not c.gpu.is_free(b))
            calls[BadInput.REPEATED_FREE] = lambda: f"cache.gpu.free([{used}, {used}])"
        if c.jobs:
            t = c.in_flight()[0]
            calls[BadInput.BAD_PARTIAL] = lambda: f"cache.complete({t}, Partial({len(c.jobs[t].items) + 1}))"
        if r is not None:
            calls[BadInput.DOUBLE_FINISH] = lambda: f"cache.release({r})"
            # the same request again, with its own prefix, as a scheduler's retry would send it
            calls[BadInput.DUPLICATE_REQUEST] = lambda: f"cache.match({r}, {self._prefix(r)!r})"
            calls[BadInput.WRITE_TOO_MANY] = lambda: f"cache.release({r}, {(1,) * (len(c.table(r)) + 1)!r})"
            calls[BadInput.HASH_MISMATCH] = lambda: f"cache.commit({r}, {(1,) * (len(c.table(r)) + 1)!r})"
            calls[BadInput.BUSY_RESET] = lambda: "cache.reset()"
            calls[BadInput.TOO_MANY] = lambda: f"cache.allocate({r}, {c.gpu.num_free + 1})"
        return calls

    def _prefix(self, r: RequestId) -> tuple[BlockHash, ...]:
        """The hashes of the cached prefix request `r` holds (none once it has ended)."""
        held = self.cache.requests.get(r)
        return () if held is None else tuple(n.hash for n in held.path)

    def observe(self) -> Observation:
        return gpu_observation(self.cache)

    def observe_cpu(self) -> Observation:
        return cpu_observation(self.cache)

    def snapshot(self) -> object:
        return snapshot(self.cache)

    def abstract(self) -> CacheState | None:
        return abstract(self.cache)

    def invariants(self) -> list[Violation]:
        return audit(self.cache)  # the machine evaluates spec/ on the abstraction and observations itself


class ReferenceCacheSmallCpu(ReferenceCache):
    """The reference with a CPU tier of one block: GPU evictions find it full of blocks in
    transit and drop leaves often, so the paths a drop takes (a parent becoming a leaf
    mid-eviction, a freed GPU block reused at once) are reached in a few steps."""

    name = "reference-small-cpu"
    cpu_blocks = 1
