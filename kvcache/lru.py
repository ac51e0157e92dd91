"""LRU leaf heaps with lazy deletion.

A node that stops being evictable keeps its entry (O(1)); eviction recognises the
stale entry when it pops it (O(log n)). The stale path is hot, and it is exactly
where FastDeploy's dropped-heap-node bug lived: a popped stale entry must leave the node
findable again, here by clearing its `in_heap` flag so that the node is offered
anew the moment it becomes evictable.
"""

from __future__ import annotations

import heapq
from typing import Callable

from kvoracle.kvcache.tree import Node


class LeafHeap:
    def __init__(self, tier: int) -> None:
        self.tier = tier
        self._entries: list[tuple[int, int, Node]] = []
        self._seq = 0  # tie-break: never compare Nodes

    def offer(self, node: Node) -> None:
        """Make an evictable node findable (no-op when it already has an entry)."""
        if node.in_heap[self.tier]:
            return
        node.in_heap[self.tier] = True
        self._push(node)

    def _push(self, node: Node) -> None:
        self._seq += 1
        heapq.heappush(self._entries, (node.last_access, self._seq, node))

    def pop_evictable(self, evictable: Callable[[Node], bool], stale: list[Node]) -> Node | None:
        """The least recently used evictable node, or None. Entries of nodes that are no
        longer evictable are dropped (each such node is appended to `stale`) and the
        node stays findable."""
        while self._entries:
            stamp, _, node = heapq.heappop(self._entries)
            if not node.alive:
                continue
            if not evictable(node):
                self._drop_stale(node)
                stale.append(node)
                continue
            if node.last_access != stamp:  # used since it was pushed: requeue at its true age
                self._push(node)
                continue
            node.in_heap[self.tier] = False
            return node
        return None

    def _drop_stale(self, node: Node) -> None:
        node.in_heap[self.tier] = False  # offered again when it next becomes evictable

    def entries(self) -> list[Node]:
        return [n for _, _, n in self._entries]

    def __len__(self) -> int:
        return len(self._entries)
