"""The safety invariants, one predicate per ID. Each returns its violations (empty = holds).

Ownership is derived here: every structure that can hold a block makes a claim on
it, and INV-CONSERVE demands exactly one claim per block.
"""

from __future__ import annotations

from collections import Counter as Multiset
from dataclasses import dataclass
from typing import Callable, Mapping

from kvoracle.spec.state import (
    CacheState,
    Observed,
    Prefetch,
    StorageWrite,
    SwapIn,
    SwapOut,
    cpu_evictable,
    gpu_evictable,
    true_counters,
)
from kvoracle.spec.types import (
    CpuBlock,
    Free,
    GpuBlock,
    InFlight,
    OnCpu,
    OnGpu,
    OwnedByNode,
    OwnedByRequest,
    Owner,
    SwappingIn,
    SwappingOut,
    gpu_block_of,
    gpu_side,
)


@dataclass(frozen=True)
class Violation:
    id: str
    message: str

    def __str__(self) -> str:
        return f"{self.id}: {self.message}"


# --- derived ownership --------------------------------------------------------------


def gpu_claims(s: CacheState) -> dict[int, list[Owner]]:
    """Every claim on every GPU block id (ids outside the tier included)."""
    claims: dict[int, list[Owner]] = {}

    def claim(g: int, o: Owner) -> None:
        claims.setdefault(g, []).append(o)

    for g in s.gpu_free:
        claim(g, Free())
    for h, n in s.nodes.items():
        if isinstance(n.tier, OnGpu | SwappingOut):
            claim(n.tier.gpu, OwnedByNode(h))
    filling: set[tuple[int, int]] = set()  # (request, block) pairs a prefetch still owns
    for tid, t in s.transfers.items():
        if isinstance(t, SwapIn):
            for _, _, g in t.items:
                claim(g, InFlight(tid))
        elif isinstance(t, Prefetch):
            for _, g in t.items:
                claim(g, InFlight(tid))
                if t.request is not None:
                    filling.add((t.request, g))
        elif isinstance(t, StorageWrite):
            for g in t.adopted:
                claim(g, InFlight(tid))
    for r, held in s.requests.items():
        for g in held.private:
            if (r, g) not in filling:
                claim(g, OwnedByRequest(r))
    return claims


def cpu_claims(s: CacheState) -> dict[int, list[Owner]]:
    claims: dict[int, list[Owner]] = {}
    for c in s.cpu_free:
        claims.setdefault(c, []).append(Free())
    for h, n in s.nodes.items():
        if isinstance(n.tier, OnCpu | SwappingIn):
            claims.setdefault(n.tier.cpu, []).append(OwnedByNode(h))
    for tid, t in s.transfers.items():
        if isinstance(t, SwapOut):
            for _, _, c in t.items:
                claims.setdefault(c, []).append(InFlight(tid))
    return claims


# --- the invariants -------------------------------------------------------------


def inv_conserve(s: CacheState) -> list[Violation]:
    """INV-CONSERVE: every block of each tier has exactly one owner."""
    out: list[Violation] = []
    for tier, size, claims in (("GPU", s.gpu_size, gpu_claims(s)), ("CPU", s.cpu_size, cpu_claims(s))):
        for b in range(size):
            owners = claims.get(b, [])
            if len(owners) != 1:
                what = ", ".join(map(_owner_text, owners)) or "nobody"
                out.append(Violation("INV-CONSERVE", f"{tier} block {b} is owned by {what}"))
    return out


def inv_refcount(s: CacheState) -> list[Violation]:
    """INV-REFCOUNT: refcount(n) = live requests whose path holds n; a child never exceeds its parent."""
    holders = Multiset(h for held in s.requests.values() for h in held.path)
    out: list[Violation] = []
    for h, n in s.nodes.items():
        if n.refcount != holders[h]:
            out.append(Violation("INV-REFCOUNT", f"node {h:#x} has refcount {n.refcount}, held by {holders[h]}"))
        p = s.nodes.get(n.parent) if n.parent is not None else None
        if p is not None and n.refcount > p.refcount:
            out.append(Violation("INV-REFCOUNT", f"node {h:#x} refcount {n.refcount} > parent's {p.refcount}"))
    return out


def inv_tree(s: CacheState) -> list[Violation]:
    """INV-TREE: parents exist, paths are chains, GPU-side nodes have GPU-side parents."""
    out: list[Violation] = []
    for h, n in s.nodes.items():
        if n.parent is None:
            continue
        p = s.nodes.get(n.parent)
        if p is None:
            out.append(Violation("INV-TREE", f"node {h:#x} has a missing parent {n.parent:#x}"))
        elif gpu_side(n.tier) and not gpu_side(p.tier):
            out.append(Violation("INV-TREE", f"node {h:#x} is on the GPU side but its parent is on CPU"))
    for r, held in s.requests.items():
        parent = None
        for h in held.path:
            on_path = s.nodes.get(h)
            if on_path is None or on_path.parent != parent:
                out.append(Violation("INV-TREE", f"request {r}'s path breaks at node {h:#x}"))
                break
            parent = h
    return out


def inv_tier(s: CacheState) -> list[Violation]:
    """INV-TIER: a GPU id never enters a CPU structure and vice versa (ids stay in their tier's range)."""
    out: list[Violation] = []
    for g in gpu_claims(s):
        if not 0 <= g < s.gpu_size:
            out.append(Violation("INV-TIER", f"GPU structure holds id {g}, outside 0..{s.gpu_size - 1}"))
    for c in cpu_claims(s):
        if not 0 <= c < s.cpu_size:
            out.append(Violation("INV-TIER", f"CPU structure holds id {c}, outside 0..{s.cpu_size - 1}"))
    return out


def inv_no_uaf(s: CacheState) -> list[Violation]:
    """INV-NO-UAF: a block in a live request's table is neither free nor another request's."""
    claims = gpu_claims(s)
    out: list[Violation] = []
    for r, held in s.requests.items():
        for h in held.path:
            n = s.nodes.get(h)
            if n is not None and gpu_block_of(n.tier) is None:
                out.append(Violation("INV-NO-UAF", f"request {r} lists node {h:#x}, which is on CPU"))
        listed = [g for h in held.path if h in s.nodes for g in [gpu_block_of(s.nodes[h].tier)] if g is not None]
        for g in [*listed, *held.private]:
            for o in claims.get(g, []):
                if isinstance(o, Free) or (isinstance(o, OwnedByRequest) and o.request != r):
                    out.append(Violation("INV-NO-UAF", f"request {r} lists GPU block {g}, owned by {_owner_text(o)}"))
    return out


def inv_pin(s: CacheState) -> list[Violation]:
    """INV-PIN: pin counts equal the transfers reading each block; a pinned block is not free."""
    want_gpu: Multiset[GpuBlock] = Multiset()
    want_cpu: Multiset[CpuBlock] = Multiset()
    for t in s.transfers.values():
        if isinstance(t, SwapOut):
            want_gpu.update(g for _, g, _ in t.items)
        elif isinstance(t, StorageWrite):
            want_gpu.update(g for _, g in t.items)
        elif isinstance(t, SwapIn):
            want_cpu.update(c for _, c, _ in t.items)
    out: list[Violation] = []
    sides: tuple[tuple[str, dict[int, int], dict[int, int], set[int]], ...] = (
        ("GPU", _ints(s.gpu_pins), _ints(want_gpu), set(s.gpu_free)),
        ("CPU", _ints(s.cpu_pins), _ints(want_cpu), set(s.cpu_free)),
    )
    for tier, have, want, free in sides:
        for b in sorted(set(have) | set(want)):
            if have.get(b, 0) != want.get(b, 0):
                out.append(Violation("INV-PIN", f"{tier} block {b} pinned {have.get(b, 0)}x, read by {want.get(b, 0)}"))
            if b in free and want.get(b, 0):
                out.append(Violation("INV-PIN", f"{tier} block {b} is free while a transfer reads it"))
    return out


def inv_heap_sound(s: CacheState, o: Observed) -> list[Violation]:
    """INV-HEAP-SOUND: every heap entry is a live node."""
    return [
        Violation("INV-HEAP-SOUND", f"{tier} heap holds node {h:#x}, not in the tree")
        for tier, found in (("GPU", o.gpu_findable), ("CPU", o.cpu_findable))
        for h in sorted(found)
        if h not in s.nodes
    ]


def inv_heap_complete(s: CacheState, o: Observed) -> list[Violation]:
    """INV-HEAP-COMPLETE: every evictable node is findable by eviction."""
    out: list[Violation] = []
    for h in s.nodes:
        if gpu_evictable(s, h) and h not in o.gpu_findable:
            out.append(Violation("INV-HEAP-COMPLETE", f"node {h:#x} is evictable on GPU but no heap holds it"))
        if cpu_evictable(s, h) and h not in o.cpu_findable:
            out.append(Violation("INV-HEAP-COMPLETE", f"node {h:#x} is evictable on CPU but no heap holds it"))
    return out


def inv_counters(s: CacheState, o: Observed) -> list[Violation]:
    """INV-COUNTERS: every reported counter equals what the structures hold."""
    true = true_counters(s)
    return [
        Violation("INV-COUNTERS", f"{name} reported {getattr(o.counters, name)}, structures hold {getattr(true, name)}")
        for name in ("gpu_free", "cpu_free", "gpu_evictable", "cpu_evictable", "gpu_in_use")
        if getattr(o.counters, name) != getattr(true, name)
    ]


STATE_INVARIANTS: dict[str, Callable[[CacheState], list[Violation]]] = {
    "INV-TIER": inv_tier,
    "INV-TREE": inv_tree,
    "INV-NO-UAF": inv_no_uaf,
    "INV-CONSERVE": inv_conserve,
    "INV-REFCOUNT": inv_refcount,
    "INV-PIN": inv_pin,
}
OBSERVED_INVARIANTS: dict[str, Callable[[CacheState, Observed], list[Violation]]] = {
    "INV-HEAP-SOUND": inv_heap_sound,
    "INV-HEAP-COMPLETE": inv_heap_complete,
    "INV-COUNTERS": inv_counters,
}


ORDER = ("INV-TIER", "INV-TREE", "INV-NO-UAF", "INV-CONSERVE", "INV-REFCOUNT", "INV-PIN",
         "INV-HEAP-SOUND", "INV-HEAP-COMPLETE", "INV-COUNTERS")


def by_severity(found: list[Violation]) -> list[Violation]:
    """Most specific first, so that a report leads with the cause, not a symptom."""
    rank = {k: i for i, k in enumerate(ORDER)}
    return sorted(found, key=lambda v: rank.get(v.id, len(ORDER)))


def check(s: CacheState, o: Observed | None = None) -> list[Violation]:
    """Every invariant, in a fixed order (the most specific first)."""
    out = [v for inv in STATE_INVARIANTS.values() for v in inv(s)]
    if o is not None:
        out += [v for inv in OBSERVED_INVARIANTS.values() for v in inv(s, o)]
    return out


def _ints(m: Mapping[GpuBlock, int] | Mapping[CpuBlock, int]) -> dict[int, int]:
    return {int(k): v for k, v in m.items()}


def _owner_text(o: Owner) -> str:
    if isinstance(o, OwnedByRequest):
        return f"request {o.request}"
    if isinstance(o, OwnedByNode):
        return f"node {o.node:#x}"
    if isinstance(o, InFlight):
        return f"transfer {o.transfer}"
    return "the free list"
