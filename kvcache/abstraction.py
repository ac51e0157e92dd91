"""The abstraction function from the reference cache to spec/, and its invariant check.

`abstract` is total: it maps broken states too, so that spec/'s predicates can name
what is broken. `view` adds the counters the reference keeps. `audit` checks what
only the implementation has (parent/child links, per-node GPU child counts, the
allocators' bitmaps), which no abstraction can carry; `check_invariants` runs both.
"""

from __future__ import annotations

from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.transfers import PrefetchJob, SwapInJob, SwapOutJob, WriteJob
from kvoracle.kvcache.tree import CPU, GPU, Node
from kvoracle.spec import invariants
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import (
    CacheState,
    Heap,
    Holding,
    Node as SpecNode,
    Prefetch,
    StorageWrite,
    SwapIn,
    SwapOut,
    Transfer,
)
from kvoracle.spec.types import OnCpu, TransferId
from kvoracle.spec.view import View, with_kept_counters


def _spec_node(n: Node) -> SpecNode:
    assert n.tier is not None and n.parent is not None
    return SpecNode(None if n.parent.is_root else n.parent.hash, n.tier, n.refcount)


def _spec_transfer(job: SwapOutJob | SwapInJob | WriteJob | PrefetchJob) -> Transfer:
    if isinstance(job, SwapOutJob):
        return SwapOut(tuple((n.hash, g, c) for n, g, c in job.items))
    if isinstance(job, SwapInJob):
        return SwapIn(job.request, tuple((n.hash, c, g) for n, c, g in job.items))
    if isinstance(job, WriteJob):
        return StorageWrite(tuple(job.items), tuple(job.adopted))
    return Prefetch(job.request, tuple(job.items))


def _heap(cache: CacheManager, tier: int, nodes: list[Node]) -> Heap:
    heap = cache.gpu_heap if tier == GPU else cache.cpu_heap
    return Heap(frozenset(n.hash for n in heap.entries() if n.alive),
                frozenset(n.hash for n in nodes if n.in_heap[tier]))


def abstract(cache: CacheManager) -> CacheState:
    nodes = cache.tree.walk()
    return CacheState(
        gpu_size=cache.gpu.size,
        cpu_size=cache.cpu.size,
        gpu_free=tuple(sorted(cache.gpu.free_blocks())),
        cpu_free=tuple(sorted(cache.cpu.free_blocks())),
        nodes={n.hash: _spec_node(n) for n in nodes},
        requests={
            r: Holding(tuple(n.hash for n in held.path), tuple(held.private)) for r, held in cache.requests.items()
        },
        transfers={TransferId(t): _spec_transfer(job) for t, job in cache.jobs.items()},
        stored=frozenset(cache.stored),
        gpu_pins=dict(cache.gpu_pins),
        cpu_pins=dict(cache.cpu_pins),
        next_transfer=cache.next_transfer,
        gpu_heap=_heap(cache, GPU, nodes),
        cpu_heap=_heap(cache, CPU, nodes),
    )


def kept_counters(cache: CacheManager) -> dict[str, int]:
    """The counters the reference keeps beside its structures, by the names
    spec.view.true_counters recounts them under."""
    return {"gpu_free": cache.gpu.num_free, "gpu_evictable": cache.gpu_evictable, "gpu_in_use": cache.gpu_in_use,
            "cpu_free": cache.cpu.num_free, "cpu_evictable": cache.cpu_evictable}


def view(cache: CacheManager, s: CacheState | None = None) -> View:
    """The complete view of the reference: its abstraction, and the counters it keeps
    next to what the abstraction recounts."""
    return with_kept_counters(abstract(cache) if s is None else s, kept_counters(cache))


def snapshot(cache: CacheManager) -> tuple[CacheState, tuple[int, ...]]:
    """Everything `view` is made of (the abstraction and the kept counters), for "a refused
    call changed nothing": equal snapshots give equal views, without deriving one twice."""
    return abstract(cache), tuple(kept_counters(cache).values())


def _referenced(cache: CacheManager) -> list[Node]:
    """Every node some structure points at."""
    out = [n for held in cache.requests.values() for n in held.path]
    out += cache.gpu_heap.entries() + cache.cpu_heap.entries()
    for job in cache.jobs.values():
        if isinstance(job, SwapOutJob | SwapInJob):
            out += [item[0] for item in job.items]
    return out


def audit(cache: CacheManager) -> list[Violation]:
    """Checks of implementation-only structure, each under the property it serves."""
    out: list[Violation] = []
    for n in cache.tree.walk():
        assert n.parent is not None
        if not n.alive or n.parent.children.get(n.hash) is not n:
            out.append(Violation("INV-TREE", f"node {n.hash:#x} is linked wrongly"))
        on_gpu = sum(1 for c in n.children.values() if c.tier is not None and not isinstance(c.tier, OnCpu))
        if on_gpu != n.gpu_children:
            out.append(Violation("INV-COUNTERS", f"node {n.hash:#x} counts {n.gpu_children} GPU children, has {on_gpu}"))
    for n in _referenced(cache):
        if n.alive and (n.parent is None or n.parent.children.get(n.hash) is not n):
            out.append(Violation("INV-TREE", f"node {n.hash:#x} is referenced but detached from the tree"))
    for name, alloc in (("GPU", cache.gpu), ("CPU", cache.cpu)):
        if any(not alloc.is_free(b) for b in alloc.free_blocks()):
            out.append(Violation("INV-CONSERVE", f"{name} free list holds a block its bitmap says is in use"))
    return out


def check_invariants(cache: CacheManager) -> list[Violation]:
    """Every safety property of the cache layer; each violation carries its ID."""
    found = audit(cache)
    if not any(v.id == "INV-TREE" for v in found):  # a detached tree's abstraction only repeats it
        found += invariants.check(view(cache))
    return invariants.by_severity(found)
