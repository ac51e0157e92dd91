"""Every property of the specification by its stable ID: its one-line meaning, and the
one predicate that defines it. docs/model.md explains each in full; tests/test_docs.py
keeps the two in step, and tests/test_one_source.py checks that each is defined once
and that no checker restates a definition.
"""

from __future__ import annotations

from collections.abc import Callable

from kvoracle.spec import invariants, liveness

SAFETY: dict[str, str] = {
    "INV-CONSERVE": "every block of each tier has exactly one owner; free lists hold no duplicates",
    "INV-REFCOUNT": "refcount(n) = live requests whose path holds n; never negative; child <= parent",
    "INV-HEAP-SOUND": "every LRU heap entry is a live node; a node's in_heap flag is set exactly when it has an entry",
    "INV-HEAP-COMPLETE": "every evictable node is findable by eviction",
    "INV-TREE": "parents exist; paths are chains; GPU-side nodes have GPU-side parents",
    "INV-TIER": "a GPU id never enters a CPU structure and vice versa",
    "INV-NO-UAF": "no block of a live request's table is free or another request's own block",
    "INV-PIN": "a block an in-flight transfer reads is not free nor handed to another request; pins = readers",
    "INV-REQUEST": "a live request is queued holding nothing, or running with a table covering its computed tokens",
    "INV-COUNTERS": "every reported counter equals what the structures hold",
    "INV-CONTENT": "every block reachable through the tree or a request's table holds its prefix's data",
}
LIVENESS: dict[str, str] = {
    "LIVE-DRAIN": "ending, completing and evicting everything frees every block, in bounded steps",
    "LIVE-EXIT": "each exit path returns the request's blocks within that step or when its transfer ends",
    "LIVE-EVICT": "with evictable nodes, eviction makes progress and never raises",
    "LIVE-TRANSFER": "every transfer completes or times out within the timeout, on the checker's clock",
    "LIVE-ADMIT": "with nothing running and nothing in flight, scheduling admits a request that fits, or makes room for it",
    "LIVE-PROGRESS": "with requests running that each fit alone and nothing in flight, scheduling computes a token",
}
PROPERTIES: dict[str, str] = {**SAFETY, **LIVENESS}

# The predicate that defines each ID (its docstring starts with the ID).
DEFINED_BY: dict[str, Callable[..., object]] = {
    **invariants.SAFETY,
    "INV-CONTENT": invariants.inv_content,
    "LIVE-DRAIN": liveness.drained,
    "LIVE-EXIT": liveness.live_exit,
    "LIVE-EVICT": liveness.live_evict,
    "LIVE-TRANSFER": liveness.live_transfer,
    "LIVE-ADMIT": liveness.live_admit,
    "LIVE-PROGRESS": liveness.live_progress,
}
