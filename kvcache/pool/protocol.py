"""The block pool Protocol and the array types every backend shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass


PoolDType = Literal["float16", "float32"]
Bytes2D = npt.NDArray[np.uint8]
Ids = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Halves = npt.NDArray[np.int64]
# Block ids: a list from the scheduler, or an int64 array from a caller that has one.
Blocks = Sequence[int] | Ids
BACKENDS: Final = ("numpy", "paddle", "torch", "cupy")


class BlockPool(Protocol):
    """`num_blocks` blocks of `block_bytes` bytes each, on one device of one backend.

    Every method validates all its arguments before it changes anything: bad input
    raises a PoolError (or BlockOutOfRange) and leaves the pool exactly as it was.
    Destination lists hold distinct ids; source lists may repeat.
    """

    backend: str  # "numpy", "paddle", "torch" or "cupy"
    device: str  # "cpu" or "cuda:N"
    dtype: str
    shape: tuple[int, int, int, int]  # (num_blocks, block_size, heads, head_dim)
    num_blocks: int
    block_bytes: int

    def copy(self, src: Blocks, dst: Blocks) -> None:
        """dst[i] := src[i] for all i, as if every source were read before any write."""
        ...

    def copy_to(self, other: BlockPool, src: Blocks, dst: Blocks) -> None:
        """other.dst[i] := self.src[i]; the bytes have landed when this returns."""
        ...

    def fill(self, blocks: Blocks, seeds: Sequence[int]) -> None:
        """Write seed_content(seeds[i]) into blocks[i] (a stand-in for prefill)."""
        ...

    def read(self, block: int) -> bytes:
        """The raw bytes of one block (for the storage tier)."""
        ...

    def write(self, blocks: Blocks, payloads: Sequence[bytes]) -> None:
        """Raw bytes into blocks, each payload exactly block_bytes long."""
        ...

    def read_rows(self, blocks: Blocks) -> Bytes2D:
        """Host copy of the blocks' bytes, shape (len(blocks), block_bytes), in one gather."""
        ...

    def write_rows(self, blocks: Blocks, rows: Bytes2D) -> None:
        """Inverse of read_rows, in one scatter."""
        ...

    def fingerprints(self, blocks: Blocks) -> list[int]:
        """The 64-bit fingerprint of each block, computed on the pool's device."""
        ...

    def audit(self, expected: Mapping[int, int]) -> list[int]:
        """Sorted ids whose fingerprint differs from expected[id], in one pass over the pool.

        Blocks absent from `expected` are not compared. A FingerprintTable of this
        pool's size is read without a Python loop.
        """
        ...
