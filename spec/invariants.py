"""The safety properties, one predicate per ID, each evaluated on a view (spec.view).

Each returns its violations (empty: it holds). A clause that needs a field the view
does not have is skipped: a view of the full state checks everything; a view of an
engine's observation checks what the engine exposes. `SAFETY` is the registry every
checker goes through; nothing outside spec/ restates these definitions.
"""

from __future__ import annotations

import numbers
from collections import Counter as Multiset
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvoracle.spec.state import CacheState, blocks_for, evictable_nodes
from kvoracle.spec.types import BlockHash, gpu_block_of, gpu_side
from kvoracle.spec.view import FREE, TierView, View, node_name


@dataclass(frozen=True)
class Violation:
    id: str
    message: str

    def __str__(self) -> str:
        return f"{self.id}: {self.message}"


def owners(t: TierView, private: Mapping[str, tuple[int, ...]] | None) -> dict[int, list[str]] | None:
    """Every claim on every block of the tier (ids outside the tier included), or None
    when a structure that can hold blocks is not known. `private`: the GPU tier's
    request-owned blocks ({} for a tier requests never hold directly)."""
    if t.free is None or t.cached is None or t.in_flight is None or private is None:
        return None
    claims: dict[int, list[str]] = {}
    for b in t.free:
        claims.setdefault(b, []).append(FREE)
    for m in (t.cached, t.in_flight):
        for b, who in m.items():
            claims.setdefault(b, []).extend(who)
    for r, blocks in private.items():
        for b in blocks:
            claims.setdefault(b, []).append(f"request {r}")
    return claims


def _private_of(v: View, t: TierView) -> Mapping[str, tuple[int, ...]] | None:
    return v.owned_privately() if t is v.gpu else {}


# --- INV-TIER ---------------------------------------------------------------------------


def inv_tier(v: View) -> list[Violation]:
    """INV-TIER: a GPU id never enters a CPU structure and vice versa: every id a tier's
    structures hold is in that tier's range."""
    out: list[Violation] = []
    for t in v.tiers():
        held: set[int] = set(t.free or ()) | set(t.cached or ()) | set(t.in_flight or ())
        if t is v.gpu:
            held |= {b for table in (v.tables or {}).values() for b in table}
        for b in sorted(held):
            if b not in t.ids:
                out.append(Violation("INV-TIER", f"a {t.name} structure holds id {b}, outside "
                                                 f"{t.ids.start}..{t.ids.stop - 1}"))
    return out


# --- INV-TREE ---------------------------------------------------------------------------


def inv_tree(v: View) -> list[Violation]:
    """INV-TREE: parents exist, GPU-side nodes have GPU-side parents, every request's
    matched path is a chain from the root (one node per hash: nodes are keyed by it)."""
    s = v.state
    if s is None:
        return []
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
        parent: BlockHash | None = None
        for h in held.path:
            on_path = s.nodes.get(h)
            if on_path is None or on_path.parent != parent:
                out.append(Violation("INV-TREE", f"request r{r}'s path breaks at node {h:#x}"))
                break
            parent = h
    return out


# --- INV-NO-UAF ---------------------------------------------------------------------------


def inv_no_uaf(v: View) -> list[Violation]:
    """INV-NO-UAF: a block in a live request's table is neither free nor another
    request's own block, and no request lists a node whose data left the GPU."""
    out: list[Violation] = []
    if v.state is not None:
        for rid, held in v.state.requests.items():
            for h in held.path:
                n = v.state.nodes.get(h)
                if n is not None and gpu_block_of(n.tier) is None:
                    out.append(Violation("INV-NO-UAF", f"request r{rid} lists {node_name(h)}, which is on CPU"))
    if v.tables is None:
        return out
    free = set(v.gpu.free or ())
    owner = {b: r for r, blocks in (v.owned_privately() or {}).items() for b in blocks}
    for r, table in sorted(v.tables.items()):
        for b in table:
            if b in free:
                out.append(Violation("INV-NO-UAF", f"request {r} lists GPU block {b}, which is on {FREE}"))
            if owner.get(b, r) != r:
                out.append(Violation("INV-NO-UAF", f"request {r} lists GPU block {b}, owned by request {owner[b]}"))
    return out


# --- INV-PIN ------------------------------------------------------------------------------


def inv_pin(v: View) -> list[Violation]:
    """INV-PIN: a block an in-flight transfer reads is neither free, nor reclaimable by
    eviction, nor handed to a request it is not read for, and its pin count equals the
    transfers reading it."""
    out: list[Violation] = []
    private = v.owned_privately() or {}
    for t in v.tiers():
        if t.reads is None:
            continue
        free = set(t.free or ())
        owner = {b: r for r, blocks in (private if t is v.gpu else {}).items() for b in blocks}
        evictable = t.evictable or frozenset()
        for b, readers in sorted(t.reads.items()):
            if b in free:
                out.append(Violation("INV-PIN", f"{t.name} block {b} is free while a transfer reads it"))
            elif b in evictable:
                out.append(Violation("INV-PIN", f"{t.name} block {b} is evictable while a transfer reads it"))
            if b in owner and owner[b] not in readers:
                out.append(Violation("INV-PIN", f"{t.name} block {b} is read by a transfer but handed to "
                                                f"request {owner[b]}"))
        if t.pins is not None:
            for b in sorted(set(t.pins) | set(t.reads)):
                have, want = t.pins.get(b, 0), len(t.reads.get(b, ()))
                if have != want:
                    out.append(Violation("INV-PIN", f"{t.name} block {b} pinned {have}x, read by {want}"))
    return out


# --- INV-CONSERVE -------------------------------------------------------------------------


def inv_conserve(v: View) -> list[Violation]:
    """INV-CONSERVE: every block of each tier has exactly one owner (the free list, a
    cache node, a request, or an unfinished transfer); free lists hold no duplicates."""
    out: list[Violation] = []
    for t in v.tiers():
        if t.free is not None:
            dup = sorted(b for b, k in Multiset(t.free).items() if k > 1)
            if dup:
                out.append(Violation("INV-CONSERVE", f"{t.name} blocks {dup} are on {FREE} twice"))
            if t.cached is not None:
                both = sorted(set(t.free) & set(t.cached))
                if both:
                    out.append(Violation("INV-CONSERVE", f"{t.name} blocks {both} are both free and cached"))
        claims = owners(t, _private_of(v, t))
        if claims is None:
            continue
        for b in t.ids:
            who = claims.get(b, [])
            if len(who) != 1:
                out.append(Violation("INV-CONSERVE", f"{t.name} block {b} is owned by {_owners_named(who)}"))
    return out


def _owners_named(who: Sequence[str]) -> str:
    """'nobody', or each owner once, with how many times it holds the block where more than once."""
    times = Multiset(who)
    return ", ".join(w if times[w] == 1 else f"{w} ({times[w]} times)" for w in dict.fromkeys(who)) or "nobody"


# --- INV-REFCOUNT -------------------------------------------------------------------------


def inv_refcount(v: View) -> list[Violation]:
    """INV-REFCOUNT: refcount(n) = the live requests whose path holds n, never negative,
    and a child's never exceeds its parent's. Without the tree, per cached block: the
    engine's count equals the tables that list the block."""
    if v.state is not None:
        return _node_refcounts(v.state)
    refs = v.gpu.refcounts
    if refs is None:
        return []
    out: list[Violation] = []
    uncounted = sorted(b for b, n in refs.items() if not isinstance(n, numbers.Integral))  # NaN, 0.5: no count
    if uncounted:
        text = ", ".join(f"block {b}: {refs[b]!r}" for b in uncounted)
        out.append(Violation("INV-REFCOUNT", f"reference counts that are no whole number: {text}"))
    counts = {b: n for b, n in refs.items() if isinstance(n, numbers.Integral)}
    negative = sorted(b for b, n in counts.items() if n < 0)
    if negative:
        out.append(Violation("INV-REFCOUNT", f"blocks {negative} have a negative reference count"))
    if v.tables is not None:
        holders = Multiset(b for t in v.tables.values() for b in set(t))
        wrong = sorted((b, n, holders[b]) for b, n in counts.items() if n >= 0 and n != holders[b])
        if wrong:
            text = ", ".join(f"block {b}: {n} (held by {k})" for b, n, k in wrong)
            out.append(Violation("INV-REFCOUNT", f"reference count differs from the live holders: {text}"))
    return out


def _node_refcounts(s: CacheState) -> list[Violation]:
    holders = Multiset(h for held in s.requests.values() for h in held.path)
    out: list[Violation] = []
    for h, n in s.nodes.items():
        if n.refcount != holders[h]:
            out.append(Violation("INV-REFCOUNT", f"{node_name(h)} has refcount {n.refcount}, held by {holders[h]}"))
        p = s.nodes.get(n.parent) if n.parent is not None else None
        if p is not None and n.refcount > p.refcount:
            out.append(Violation("INV-REFCOUNT", f"{node_name(h)} refcount {n.refcount} > parent's {p.refcount}"))
    return out


# --- INV-HEAP-SOUND, INV-HEAP-COMPLETE ----------------------------------------------------


def inv_heap_sound(v: View) -> list[Violation]:
    """INV-HEAP-SOUND: every LRU heap entry is a live node, and a node's in_heap flag is
    set exactly when its tier's heap holds an entry for it. Without the full state:
    every node the engine's eviction structure holds is a node of its tree."""
    s = v.state
    if s is None:
        return [Violation("INV-HEAP-SOUND", f"{t.name} eviction holds node {n}, not in the tree")
                for t in v.tiers() if t.nodes is not None and t.findable is not None
                for n in sorted(t.findable - t.nodes)]
    out: list[Violation] = []
    for tier, heap in (("GPU", s.gpu_heap), ("CPU", s.cpu_heap)):
        for h in sorted(heap.entries.difference(s.nodes)):
            out.append(Violation("INV-HEAP-SOUND", f"{tier} heap holds {node_name(h)}, not in the tree"))
        for h in sorted(heap.flagged - heap.entries):
            out.append(Violation("INV-HEAP-SOUND", f"{node_name(h)} is flagged in the {tier} heap but has no entry"))
        for h in sorted(heap.entries - heap.flagged):
            out.append(Violation("INV-HEAP-SOUND", f"{node_name(h)} has a {tier} heap entry but no flag"))
    return out


def inv_heap_complete(v: View) -> list[Violation]:
    """INV-HEAP-COMPLETE: every evictable node is findable by eviction (has an entry)."""
    s = v.state
    if s is None:
        return []
    gpu, cpu = evictable_nodes(s)
    return [Violation("INV-HEAP-COMPLETE", f"{node_name(h)} is evictable on {tier} but no heap holds it")
            for tier, evictable, heap in (("GPU", gpu, s.gpu_heap), ("CPU", cpu, s.cpu_heap))
            for h in evictable if h not in heap.entries]


# --- INV-COUNTERS -------------------------------------------------------------------------


def inv_counters(v: View) -> list[Violation]:
    """INV-COUNTERS: every counter an implementation reports equals the recount."""
    return [
        Violation("INV-COUNTERS", f"{name} reported {got}, the structures hold {real}")
        for t in v.tiers()
        for name, (got, real) in sorted(t.counters.items())
        if got != real
    ]


# --- INV-REQUEST --------------------------------------------------------------------------


def inv_request(v: View) -> list[Violation]:
    """INV-REQUEST: each live request is either queued, holding no blocks, or running,
    holding a table that covers every token whose KV it has computed; an exited
    request holds nothing."""
    if v.tables is None or v.live is None:
        return []
    out: list[Violation] = []
    queued = v.queued if v.queued is not None else v.live - set(v.tables)
    stray = sorted(set(v.tables) - v.live)
    if stray:
        out.append(Violation("INV-REQUEST", f"requests {stray} hold blocks but are not live"))
    missing = sorted(v.live - set(v.tables) - queued)
    if missing:
        out.append(Violation("INV-REQUEST", f"requests {missing} are running but hold no blocks"))
    holding = sorted(set(v.tables) & queued)
    if holding:
        out.append(Violation("INV-REQUEST", f"queued requests {holding} hold blocks"))
    for r, table in sorted(v.tables.items()):
        need = blocks_for((v.computed or {}).get(r, 0), v.block_size)
        if len(table) < need:
            out.append(Violation("INV-REQUEST", f"request {r} holds {len(table)} blocks for {need} blocks of "
                                                f"computed tokens"))
    return out


# --- INV-CONTENT --------------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    """What a block must hold: `want`, the fingerprint of the prefix it stands for;
    `have`, the fingerprint read from the block pool."""

    tier: str
    block: int
    want: int
    have: int


def inv_content(blocks: Sequence[Content]) -> list[Violation]:
    """INV-CONTENT: every block reachable through the tree or a ready request's table
    holds the data of exactly the prefix it stands for."""
    return [Violation("INV-CONTENT", f"{c.tier} block {c.block} holds {c.have:#018x}, its prefix needs {c.want:#018x}")
            for c in blocks if c.have != c.want]


# --- the registry -------------------------------------------------------------------------

# Most specific first, so that a report leads with the cause, not a symptom.
SAFETY: dict[str, Callable[[View], list[Violation]]] = {
    "INV-TIER": inv_tier,
    "INV-TREE": inv_tree,
    "INV-NO-UAF": inv_no_uaf,
    "INV-PIN": inv_pin,
    "INV-CONSERVE": inv_conserve,
    "INV-REFCOUNT": inv_refcount,
    "INV-REQUEST": inv_request,
    "INV-HEAP-SOUND": inv_heap_sound,
    "INV-HEAP-COMPLETE": inv_heap_complete,
    "INV-COUNTERS": inv_counters,
}


def check(v: View) -> list[Violation]:
    """Every safety property the view allows, the most specific first."""
    return [found for predicate in SAFETY.values() for found in predicate(v)]


def by_severity(found: list[Violation]) -> list[Violation]:
    """Violations in registry order (a stable sort: within an ID, as found)."""
    rank = {k: i for i, k in enumerate(SAFETY)}
    return sorted(found, key=lambda x: rank.get(x.id, len(SAFETY)))
