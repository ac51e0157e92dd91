"""Fresh blocks hold garbage: what the scheduler rows do to a block the allocator hands out.

A real device reuses freed memory: a block handed out again still holds whatever its
last owner left, often the very bytes a bug would need (the same prefix, evicted a moment
ago and given back by a last-in first-out free list). A block that is read before it is
written then looks right, and INV-CONTENT cannot tell. So the reference rows overwrite
every block the allocator hands out with bytes no prefix has, before the engine sees it:
whatever the engine does not write afterwards is caught as the wrong content (a fill that
lands without its copy, a prefill that skips a block). Nothing of the reference changes:
the allocator instances of the row's engine are wrapped, once, in its preamble.
"""

from __future__ import annotations

from collections.abc import Callable

from kvoracle.kvcache.allocator import B, BlockAllocator
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool.protocol import BlockPool
from kvoracle.scheduler.content import KVPools

# The content seed of garbage. Real seeds are 64-bit block hashes: one equal to this is a
# 2^-64 event per block.
GARBAGE = 0x9A8B_A6E0_0DDB_10C5


def garbage_in_fresh_blocks(cache: CacheManager, pools: KVPools) -> None:
    """From now on each block `cache` allocates on either tier holds garbage when it gets it."""
    _wrap(cache.gpu, pools.gpu)
    _wrap(cache.cpu, pools.cpu)


def _wrap(allocator: BlockAllocator[B], pool: BlockPool) -> None:
    allocate: Callable[[int], list[B]] = allocator.allocate

    def allocate_garbage(n: int) -> list[B]:
        blocks = allocate(n)
        pool.fill(blocks, [GARBAGE] * len(blocks))
        return blocks

    setattr(allocator, "allocate", allocate_garbage)  # this instance only: the class stays the reference's
