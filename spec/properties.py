"""Every property of the specification, by its stable ID, with its one-line meaning.

docs/model.md defines each in full; tests/test_docs.py keeps the two in step.
"""

SAFETY: dict[str, str] = {
    "INV-CONSERVE": "every block of each tier has exactly one owner; free lists hold no duplicates",
    "INV-REFCOUNT": "refcount(n) = live requests whose path holds n; never negative; child <= parent",
    "INV-HEAP-SOUND": "every LRU heap entry is a live node and agrees with the node's in_heap flag",
    "INV-HEAP-COMPLETE": "every evictable node is findable by eviction",
    "INV-TREE": "parent/child links agree; no two nodes share a hash; GPU-side nodes have GPU-side parents",
    "INV-TIER": "a GPU id never enters a CPU structure and vice versa",
    "INV-NO-UAF": "no block of a live request's table is free or another request's private block",
    "INV-PIN": "pin counts equal the transfers reading a block; a pinned block is not free",
    "INV-REQUEST": "each request is in exactly one state; only a running request holds blocks",
    "INV-COUNTERS": "every reported counter equals what the structures hold",
    "INV-CONTENT": "every block reachable through the tree or a request's table holds its prefix's fingerprint",
}
LIVENESS: dict[str, str] = {
    "LIVE-DRAIN": "releasing, completing and evicting everything frees every block, in bounded steps",
    "LIVE-EXIT": "each exit path returns the request's blocks within that step or when its transfer ends",
    "LIVE-EVICT": "with evictable nodes, eviction makes progress; a failed transfer never disables it",
    "LIVE-TRANSFER": "every transfer completes or times out",
}
PROPERTIES: dict[str, str] = {**SAFETY, **LIVENESS}
