"""Fresh and freed blocks hold garbage: what the scheduler rows do to a block the
allocator hands out or takes back.

A real device reuses freed memory: a block handed out again still holds whatever its
last owner left, often the very bytes a bug would need (the same prefix, evicted a moment
ago and given back by a last-in first-out free list). A block that is read before it is
written then looks right, and INV-CONTENT cannot tell. So the reference rows overwrite
every block the allocator hands out with bytes no prefix has, before the engine sees it:
whatever the engine does not write afterwards is caught as the wrong content (a fill that
lands without its copy, a prefill that skips a block). Likewise every block it takes
back: on a device whose copies run on their own stream, a block freed before its bytes
are copied out may be handed out and overwritten first, so a copy that reads a freed
block copies garbage here (a swap completed before its copy ran: INV-CONTENT). Nothing
of the reference changes: the allocator instances of the row's engine are wrapped, once,
in its preamble.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvoracle.kvcache.allocator import B, BlockAllocator
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool.protocol import BlockPool
from kvoracle.scheduler.content import KVPools

# The content seed of garbage. Real seeds are 64-bit block hashes: one equal to this is a
# 2^-64 event per block.
GARBAGE = 0x9A8B_A6E0_0DDB_10C5


def garbage_in_fresh_and_freed_blocks(cache: CacheManager, pools: KVPools) -> None:
    """From now on each block `cache` allocates or frees on either tier holds garbage when
    it is handed out and when it is taken back."""
    _garbage_when_allocated(cache.gpu, pools.gpu)
    _garbage_when_freed(cache.gpu, pools.gpu)
    _garbage_when_allocated(cache.cpu, pools.cpu)
    _garbage_when_freed(cache.cpu, pools.cpu)


def _garbage_when_allocated(allocator: BlockAllocator[B], pool: BlockPool) -> None:
    allocate: Callable[[int], list[B]] = allocator.allocate

    def allocate_garbage(n: int) -> list[B]:
        blocks = allocate(n)
        pool.fill(blocks, [GARBAGE] * len(blocks))
        return blocks

    setattr(allocator, "allocate", allocate_garbage)  # this instance only: the class stays the reference's


def _garbage_when_freed(allocator: BlockAllocator[B], pool: BlockPool) -> None:
    free: Callable[[Sequence[B]], None] = allocator.free

    def free_to_garbage(blocks: Sequence[B]) -> None:
        free(blocks)  # refused (a double free, an id past the pool): nothing freed, nothing overwritten
        pool.fill(list(blocks), [GARBAGE] * len(blocks))

    setattr(allocator, "free", free_to_garbage)
