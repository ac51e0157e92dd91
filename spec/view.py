"""Views: the state as far as a checker knows it, which is what every property is
evaluated on.

A view of the full state (`of_cache`, `of_system`) knows everything. A view built
from an engine's observation (oracle.engine.view_of) knows what the engine exposes;
a field it cannot fill is None, and every clause of a property that needs that field
is skipped (docs/model.md lists what each clause needs). So the model checker, the
machines, the engine checks and the trace checker evaluate the same predicates
(spec.invariants, spec.liveness) on views of different completeness.

Requests are named by strings ("r<id>" for spec's integer ids), blocks by integers.
Owners are named in words ("the free list", "node 0x..", "request r1", "transfer 3"),
so that a violation reads the same whoever found it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvoracle.spec.actions import table
from kvoracle.spec.frozen import replace
from kvoracle.spec.state import (
    EXITED,
    QUEUED,
    CacheState,
    Prefetch,
    Status,
    StorageWrite,
    SwapIn,
    SwapOut,
    System,
    cpu_evictable,
    gpu_evictable,
)
from kvoracle.spec.types import OnCpu, OnGpu, RequestId, SwappingIn, SwappingOut

FREE = "the free list"


def request_name(r: RequestId | int) -> str:
    return f"r{r}"


def node_name(h: int) -> str:
    return f"node {h:#x}"


def transfer_name(t: int) -> str:
    return f"transfer {t}"


@dataclass(frozen=True)
class TierView:
    """One tier's blocks. Each mapping names, per block, who holds it that way."""

    name: str  # "GPU" or "CPU"
    ids: range  # every block id of the tier
    free: tuple[int, ...] | None = None  # the free list(s), duplicates kept
    cached: Mapping[int, tuple[str, ...]] | None = None  # block -> the cache nodes owning it
    in_flight: Mapping[int, tuple[str, ...]] | None = None  # block -> unfinished transfers owning it
    reads: Mapping[int, tuple[str, ...]] | None = None  # block -> for whom in-flight transfers read it ("": no request)
    pins: Mapping[int, int] | None = None  # block -> the pin count the engine keeps
    evictable: frozenset[int] | None = None  # blocks the engine would reclaim on demand
    refcounts: Mapping[int, int] | None = None  # cached block -> the engine's count of requests using it
    counters: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name -> (reported, recounted)
    # Without the full state: the nodes of this tier in the engine's tree (any names), and
    # the nodes its eviction structure (heap, leaf set) can reach.
    nodes: frozenset[str] | None = None
    findable: frozenset[str] | None = None


@dataclass(frozen=True)
class View:
    gpu: TierView
    cpu: TierView | None = None  # None: no CPU tier is known
    tables: Mapping[str, tuple[int, ...]] | None = None  # live request -> its GPU block table
    private: Mapping[str, tuple[int, ...]] | None = None  # None: the table blocks that are not cached
    # The request lifecycle (INV-REQUEST): who has not exited, who is queued, what is computed.
    live: frozenset[str] | None = None
    queued: frozenset[str] | None = None
    computed: Mapping[str, int] | None = None  # running request -> tokens whose KV is computed
    block_size: int = 1
    state: CacheState | None = None  # the full cache state (tree, paths, heaps) when known

    def owned_privately(self) -> Mapping[str, tuple[int, ...]] | None:
        """Each live request's own blocks: given, or its table minus the cache's blocks."""
        if self.private is not None:
            return self.private
        if self.tables is None or self.gpu.cached is None:
            return None
        cached = self.gpu.cached
        return {r: tuple(b for b in t if b not in cached) for r, t in self.tables.items()}

    def tiers(self) -> tuple[TierView, ...]:
        return (self.gpu,) if self.cpu is None else (self.gpu, self.cpu)


def _add(m: dict[int, tuple[str, ...]], block: int, who: str) -> None:
    m[block] = m.get(block, ()) + (who,)


def of_cache(s: CacheState, counters: Mapping[str, tuple[int, int]] | None = None,
             cpu_counters: Mapping[str, tuple[int, int]] | None = None) -> View:
    """The complete view of a cache state; `counters` are what an implementation reports
    next to it, each with the recount from `s` (see true_counters)."""
    gpu_cached: dict[int, tuple[str, ...]] = {}
    cpu_cached: dict[int, tuple[str, ...]] = {}
    for h, n in s.nodes.items():
        if isinstance(n.tier, OnGpu | SwappingOut):
            _add(gpu_cached, n.tier.gpu, node_name(h))
        if isinstance(n.tier, OnCpu | SwappingIn):
            _add(cpu_cached, n.tier.cpu, node_name(h))
    gpu_flight: dict[int, tuple[str, ...]] = {}
    cpu_flight: dict[int, tuple[str, ...]] = {}
    gpu_reads: dict[int, tuple[str, ...]] = {}
    cpu_reads: dict[int, tuple[str, ...]] = {}
    filling: set[tuple[RequestId, int]] = set()  # (request, block): a prefetch still owns it
    for t, tr in s.transfers.items():
        who = transfer_name(t)
        if isinstance(tr, SwapOut):
            for _, g, c in tr.items:
                _add(gpu_reads, g, "")
                _add(cpu_flight, c, who)
        elif isinstance(tr, SwapIn):
            for _, c, g in tr.items:
                _add(cpu_reads, c, "")
                _add(gpu_flight, g, who)
        elif isinstance(tr, StorageWrite):
            for _, g in tr.items:
                _add(gpu_reads, g, "")
            for g in tr.adopted:
                _add(gpu_flight, g, who)
        else:
            for _, g in tr.items:
                _add(gpu_flight, g, who)
                if tr.request is not None:
                    filling.add((tr.request, g))
    private = {request_name(r): tuple(g for g in held.private if (r, g) not in filling)
               for r, held in s.requests.items()}
    tables = {request_name(r): _listed(s, r) for r in s.requests}
    gpu = TierView("GPU", range(s.gpu_size), tuple(s.gpu_free), gpu_cached, gpu_flight, gpu_reads,
                   {int(b): n for b, n in s.gpu_pins.items()}, None, None, dict(counters or {}))
    cpu = TierView("CPU", range(s.cpu_size), tuple(s.cpu_free), cpu_cached, cpu_flight, cpu_reads,
                   {int(b): n for b, n in s.cpu_pins.items()}, None, None, dict(cpu_counters or {}))
    return View(gpu, cpu, tables, private, state=s)


def _listed(s: CacheState, r: RequestId) -> tuple[int, ...]:
    """r's table as far as its path nodes still exist (a broken path is INV-TREE's)."""
    held = s.requests[r]
    if all(h in s.nodes for h in held.path):
        return tuple(table(s, r))
    return tuple(held.private)


def of_system(s: System) -> View:
    """The complete view of the system: the cache, and who is live, queued, computed."""
    v = of_cache(s.cache)
    live = frozenset(request_name(r) for r, q in s.requests.items() if q.status not in EXITED)
    queued = frozenset(request_name(r) for r, q in s.requests.items() if q.status in QUEUED)
    computed = {request_name(r): q.computed for r, q in s.requests.items() if q.status is Status.RUNNING}
    return replace(v, live=live, queued=queued, computed=computed, block_size=s.block_size)


def with_kept_counters(s: CacheState, kept: Mapping[str, int]) -> View:
    """The complete view of s with the counters an implementation keeps beside it (named
    as true_counters names them), each paired with its recount and given to the tier its
    name starts with."""
    true = true_counters(s)
    paired = {name: (count, true[name]) for name, count in kept.items()}
    return of_cache(s, {k: c for k, c in paired.items() if k.startswith("gpu")},
                    {k: c for k, c in paired.items() if k.startswith("cpu")})


def true_counters(s: CacheState) -> dict[str, int]:
    """What each counter an implementation keeps must equal (INV-COUNTERS recounts)."""
    return {
        "gpu_free": len(s.gpu_free),
        "cpu_free": len(s.cpu_free),
        "gpu_evictable": sum(1 for h in s.nodes if gpu_evictable(s, h)),
        "cpu_evictable": sum(1 for h in s.nodes if cpu_evictable(s, h)),
        "gpu_in_use": s.gpu_size - len(s.gpu_free),
    }
