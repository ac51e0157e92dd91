"""The radix prefix tree: one node per cached full block, keyed by chained block hash."""

from __future__ import annotations

from kvoracle.spec.types import BlockHash, TierState, gpu_side

GPU, CPU = 0, 1  # index into Node.in_heap


class Node:
    """A cached block. `gpu_children` counts children on the GPU side, so the
    evictability test is O(1); `in_heap[tier]` says an LRU heap holds an entry."""

    __slots__ = ("hash", "parent", "children", "tier", "refcount", "last_access", "gpu_children", "in_heap", "alive")

    def __init__(self, h: BlockHash, parent: Node | None, tier: TierState | None) -> None:
        self.hash = h
        self.parent = parent
        self.children: dict[BlockHash, Node] = {}
        self.tier = tier  # None only for the root, which holds no block
        self.refcount = 0
        self.last_access = 0
        self.gpu_children = 0
        self.in_heap = [False, False]
        self.alive = True

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __repr__(self) -> str:
        return f"Node({self.hash:#x}, {self.tier}, ref={self.refcount})"


class RadixTree:
    """Parent/child links and the `gpu_children` counts; nothing about policy."""

    def __init__(self) -> None:
        self.root = Node(BlockHash(0), None, None)
        self.by_hash: dict[BlockHash, Node] = {}  # chained hashes name a block tree-wide

    def add_child(self, parent: Node, h: BlockHash, tier: TierState) -> Node:
        node = Node(h, parent, tier)
        self.link(parent, node)
        return node

    def link(self, parent: Node, node: Node) -> None:
        parent.children[node.hash] = node
        self.by_hash[node.hash] = node
        if node.tier is not None and gpu_side(node.tier):
            parent.gpu_children += 1

    def remove_leaf(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children, "only leaves leave the tree"
        del parent.children[node.hash]
        if self.by_hash.get(node.hash) is node:
            del self.by_hash[node.hash]
        if node.tier is not None and gpu_side(node.tier):
            parent.gpu_children -= 1
        node.alive = False

    def set_tier(self, node: Node, tier: TierState) -> None:
        assert node.parent is not None and node.tier is not None
        node.parent.gpu_children += gpu_side(tier) - gpu_side(node.tier)
        node.tier = tier

    @property
    def size(self) -> int:
        return len(self.by_hash)

    def walk(self) -> list[Node]:
        """Every node reachable from the root, parents before children."""
        out: list[Node] = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out
