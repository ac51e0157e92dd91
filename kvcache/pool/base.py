"""The shared shell of every pool: validation and the public API; backends supply data movement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.errors import (
    BatchMismatch,
    GeometryError,
    PayloadSizeError,
    PoolMismatch,
)
from kvoracle.kvcache.pool.fingerprint import (
    _differs,
    _expected_arrays,
    _finish,
    _scheme,
    seed_content,
)
from kvoracle.kvcache.pool.protocol import (
    U64,
    BlockPool,
    Blocks,
    Bytes2D,
    Halves,
    Ids,
    Mask,
    PoolDType,
)
from kvoracle.kvcache.pool.validation import (
    _as_ids,
    _block_bytes,
    _check_distinct,
    _check_range,
)


class _PoolBase(ABC):
    """Validation and the public API; a backend supplies the data movement hooks."""

    _CHUNK_BYTES = 8 << 20  # pool bytes per fingerprinting step: bounds temporaries

    def __init__(
        self, backend: str, device: str, num_blocks: int, block_size: int, heads: int,
        head_dim: int, dtype: PoolDType,
    ) -> None:
        if num_blocks < 1:
            raise GeometryError(f"num_blocks must be positive, got {num_blocks}")
        self.backend = backend
        self.device = device
        self.dtype: str = dtype
        self.shape = (num_blocks, block_size, heads, head_dim)
        self.num_blocks = num_blocks
        self.block_bytes = _block_bytes(block_size, heads, head_dim, dtype)
        self._word = 8 if self.block_bytes % 8 == 0 else 4  # copy granule: the widest that fits
        self._np_word = np.dtype(np.int64) if self._word == 8 else np.dtype(np.int32)
        self._scheme = _scheme(self.block_bytes)
        self._chunk = max(1, self._chunk_bytes() // self.block_bytes)
        self._label = f"{backend} {device} pool"

    def _chunk_bytes(self) -> int:
        return self._CHUNK_BYTES

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend} {self.device} {self.shape} {self.dtype}>"

    # validation -------------------------------------------------------------

    def _ids(self, blocks: Blocks, *, distinct: bool = False) -> Ids:
        ids = _as_ids(blocks)
        _check_range(ids, self._label, self.num_blocks)
        if distinct:
            _check_distinct(ids, self._label)
        return ids

    def _same_layout(self, other: BlockPool) -> None:
        if other.shape[1:] != self.shape[1:] or other.dtype != self.dtype:
            raise PoolMismatch(
                f"cannot copy {self.shape[1:]} {self.dtype} blocks into {other.shape[1:]} {other.dtype}"
            )

    def _host_rows(self, rows: Bytes2D, count: int) -> Bytes2D:
        if rows.dtype != np.uint8 or rows.shape != (count, self.block_bytes):
            raise PayloadSizeError(self._label, f"{rows.dtype} {rows.shape}", self.block_bytes)
        rows = np.ascontiguousarray(rows)
        return rows if rows.flags.writeable else rows.copy()  # torch wants writable memory

    # public API ---------------------------------------------------------------

    def copy(self, src: Blocks, dst: Blocks) -> None:
        s, d = self._ids(src), self._ids(dst, distinct=True)
        if s.size != d.size:
            raise BatchMismatch(f"{self._label} copy", s.size, d.size)
        if s.size:
            self._copy_rows(s, d)

    def copy_to(self, other: BlockPool, src: Blocks, dst: Blocks) -> None:
        self._same_layout(other)
        s, d = self._ids(src), _as_ids(dst)
        _check_range(d, f"{other.backend} {other.device} pool", other.num_blocks)
        _check_distinct(d, f"{other.backend} {other.device} pool")
        if s.size != d.size:
            raise BatchMismatch(f"{self._label} copy_to", s.size, d.size)
        if not s.size:
            return
        if isinstance(other, _PoolBase) and (self._direct_to(other, s, d) or other._direct_from(self, s, d)):
            return
        other.write_rows(d, self._gather_host(s))  # different backends meet in host memory

    def fill(self, blocks: Blocks, seeds: Sequence[int]) -> None:
        d = self._ids(blocks, distinct=True)
        if len(seeds) != d.size:
            raise BatchMismatch(f"{self._label} fill", d.size, len(seeds))
        if d.size:
            self._scatter_host(d, seed_content(seeds, self.block_bytes))

    def read(self, block: int) -> bytes:
        data: bytes = self._gather_host(self._ids([block]))[0].tobytes()
        return data

    def write(self, blocks: Blocks, payloads: Sequence[bytes]) -> None:
        d = self._ids(blocks, distinct=True)
        if len(payloads) != d.size:
            raise BatchMismatch(f"{self._label} write", d.size, len(payloads))
        for p in payloads:
            if len(p) != self.block_bytes:
                raise PayloadSizeError(self._label, f"{len(p)} bytes", self.block_bytes)
        if d.size:
            joined = bytearray().join(payloads)  # writable: torch.from_numpy wants that
            self._scatter_host(d, np.frombuffer(joined, dtype=np.uint8).reshape(d.size, -1))

    def read_rows(self, blocks: Blocks) -> Bytes2D:
        s = self._ids(blocks)
        if not s.size:
            return np.zeros((0, self.block_bytes), dtype=np.uint8)
        return self._gather_host(s)

    def write_rows(self, blocks: Blocks, rows: Bytes2D) -> None:
        d = self._ids(blocks, distinct=True)
        rows = self._host_rows(rows, d.size)
        if d.size:
            self._scatter_host(d, rows)

    def fingerprints(self, blocks: Blocks) -> list[int]:
        s = self._ids(blocks)
        out = np.zeros((s.size, 2), dtype=np.int64)
        for a in range(0, s.size, self._chunk):
            out[a:a + self._chunk] = self._halves_of(s[a:a + self._chunk])
        return _finish(out)

    def audit(self, expected: Mapping[int, int]) -> list[int]:
        fp, present = _expected_arrays(expected, self.num_blocks, self._label)
        bad: list[int] = self._mismatches(fp, present).tolist()
        return bad

    # hooks ----------------------------------------------------------------------

    @abstractmethod
    def _copy_rows(self, s: Ids, d: Ids) -> None:
        """One gather of rows s, one scatter into rows d (validated, same length)."""

    @abstractmethod
    def _gather_host(self, s: Ids) -> Bytes2D:
        """Rows s as a fresh host array (len(s), block_bytes)."""

    @abstractmethod
    def _scatter_host(self, d: Ids, rows: Bytes2D) -> None:
        """Host rows (contiguous, writable) into rows d."""

    @abstractmethod
    def _halves_of(self, s: Ids) -> Halves:
        """(A mod 2**32, B mod 2**32) of rows s, computed on the device."""

    @abstractmethod
    def _halves_range(self, start: int, stop: int) -> Halves:
        """Likewise for the contiguous rows start..stop-1, without a gather."""

    def _mismatches(self, fp: U64, present: Mask) -> Ids:
        """Ids of present blocks whose fingerprint differs; compared on the host."""
        bad = np.zeros(self.num_blocks, dtype=np.bool_)
        for a in range(0, self.num_blocks, self._chunk):
            b = min(self.num_blocks, a + self._chunk)
            if present[a:b].any():
                bad[a:b] = present[a:b] & _differs(self._halves_range(a, b), fp[a:b])
        return np.flatnonzero(bad).astype(np.int64)

    def _direct_to(self, other: _PoolBase, s: Ids, d: Ids) -> bool:
        """Copy without passing through host numpy arrays, when this backend can; else False."""
        return False

    def _direct_from(self, source: _PoolBase, s: Ids, d: Ids) -> bool:
        return False
