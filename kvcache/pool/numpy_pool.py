"""The numpy pool: host memory, and the reference every other backend matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.base import _PoolBase
from kvoracle.kvcache.pool.fingerprint import _np_halves
from kvoracle.kvcache.pool.protocol import Bytes2D, Halves, Ids, PoolDType


class NumpyPool(_PoolBase):
    """Host memory; numpy fancy indexing gathers and scatters whole rows."""

    def __init__(
        self, num_blocks: int, block_size: int, heads: int, head_dim: int,
        dtype: PoolDType = "float16", *, backend: str = "numpy", buffer: Bytes2D | None = None,
    ) -> None:
        super().__init__(backend, "cpu", num_blocks, block_size, heads, head_dim, dtype)
        raw = np.zeros(num_blocks * self.block_bytes, dtype=np.uint8) if buffer is None else buffer
        self._rows = raw.reshape(num_blocks, self.block_bytes)
        self.data = raw.view(np.dtype(dtype)).reshape(self.shape)  # the tensor an engine would use

    def _copy_rows(self, s: Ids, d: Ids) -> None:
        self._rows[d] = self._rows[s]  # the right side is gathered into a copy first

    def _gather_host(self, s: Ids) -> Bytes2D:
        return self._rows[s]

    def _scatter_host(self, d: Ids, rows: Bytes2D) -> None:
        self._rows[d] = rows

    def _halves_of(self, s: Ids) -> Halves:
        return _np_halves(self._rows[s].view(np.int8), self._scheme)

    def _halves_range(self, start: int, stop: int) -> Halves:
        return _np_halves(self._rows[start:stop].view(np.int8), self._scheme)
