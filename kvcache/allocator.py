"""Per-tier block allocators: O(1) allocate and free, and no silent double free."""

from __future__ import annotations

from typing import Callable, Generic, Sequence, TypeVar

from kvoracle.kvcache.errors import BlockOutOfRange, DoubleFree, OutOfBlocks
from kvoracle.spec.types import CpuBlock, GpuBlock

B = TypeVar("B", GpuBlock, CpuBlock)


class BlockAllocator(Generic[B]):
    """A free stack plus a free bitmap: the stack gives O(1) allocate, the bitmap O(1) validation."""

    def __init__(self, tier: str, size: int, make: Callable[[int], B]) -> None:
        if size < 0:
            raise ValueError(f"{tier} pool size must be >= 0, got {size}")
        self.tier = tier
        self.size = size
        self._free: list[B] = [make(b) for b in reversed(range(size))]
        self._is_free = bytearray(b"\x01") * size

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[B]:
        """n distinct free blocks, or OutOfBlocks and nothing taken."""
        if n < 0 or n > len(self._free):
            raise OutOfBlocks(self.tier, n, len(self._free))
        taken = [self._free.pop() for _ in range(n)]
        for b in taken:
            self._is_free[b] = 0
        return taken

    def free(self, blocks: Sequence[B]) -> None:
        """Return blocks. Validates the whole batch first: a bad id frees nothing."""
        seen: set[int] = set()
        for b in blocks:
            if not 0 <= b < self.size:
                raise BlockOutOfRange(self.tier, b, self.size)
            if self._is_free[b] or b in seen:
                raise DoubleFree(self.tier, b)
            seen.add(b)
        self._release(blocks)

    def _release(self, blocks: Sequence[B]) -> None:
        for b in blocks:
            self._is_free[b] = 1
            self._free.append(b)

    def is_free(self, block: int) -> bool:
        return 0 <= block < self.size and bool(self._is_free[block])

    def free_blocks(self) -> list[B]:
        """A snapshot of the free stack (duplicates included, should a bug create any)."""
        return list(self._free)
