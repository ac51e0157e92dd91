"""The paddle pool: CPU here, a GPU with paddlepaddle-gpu.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    import paddle
from kvoracle.kvcache.pool.base import _PoolBase
from kvoracle.kvcache.pool.errors import DeviceUnavailable
from kvoracle.kvcache.pool.fingerprint import _K, _M32
from kvoracle.kvcache.pool.protocol import Bytes2D, Halves, Ids, PoolDType
from kvoracle.kvcache.pool.validation import _cuda_index, _load


def _load_paddle() -> None:
    _load("paddle", "paddle")


class PaddlePool(_PoolBase):
    """paddle tensors on CPU (or a GPU with paddlepaddle-gpu).

    paddle's CPU build has no fp16 (nor uint8) index_select/scatter kernels: rows move
    as int64 (or int32) words, a view of the same memory.
    """

    def __init__(
        self, device: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
        dtype: PoolDType = "float16",
    ) -> None:
        _load_paddle()
        import paddle

        super().__init__("paddle", device, num_blocks, block_size, heads, head_dim, dtype)
        if device == "cpu":
            self._place: paddle.CPUPlace | paddle.CUDAPlace = paddle.CPUPlace()
        elif paddle.device.is_compiled_with_cuda() and _cuda_index(device) < paddle.device.cuda.device_count():
            self._place = paddle.CUDAPlace(_cuda_index(device))
        else:
            raise DeviceUnavailable("paddle", f"this paddle build has no {device}")
        self.data = paddle.zeros(list(self.shape), dtype=dtype, device=self._place)
        word: Literal["int64", "int32"] = "int64" if self._word == 8 else "int32"
        self._words = paddle.view(self.data.reshape([num_blocks, -1]), word)
        self._bytes8 = paddle.view(self._words, "int8")
        self._w32 = paddle.to_tensor(self._scheme.w32, place=self._place)
        self._u = paddle.to_tensor(self._scheme.u.reshape(1, -1, 2), place=self._place)
        self._m32 = paddle.to_tensor(np.int64(_M32), place=self._place)

    def _index(self, ids: Ids) -> paddle.Tensor:
        import paddle

        return paddle.to_tensor(ids, dtype="int64", place=self._place)

    def _copy_rows(self, s: Ids, d: Ids) -> None:
        import paddle

        rows = paddle.index_select(self._words, self._index(s), axis=0)
        self._words.scatter_(self._index(d), rows, overwrite=True)

    def _gather_host(self, s: Ids) -> Bytes2D:
        import paddle

        rows = paddle.index_select(self._words, self._index(s), axis=0).numpy()
        return np.ascontiguousarray(rows).view(np.uint8)

    def _scatter_host(self, d: Ids, rows: Bytes2D) -> None:
        import paddle

        words = paddle.to_tensor(rows.view(self._np_word), place=self._place)
        self._words.scatter_(self._index(d), words, overwrite=True)

    def _halves(self, x8: paddle.Tensor) -> Halves:
        import paddle

        sc, n = self._scheme, x8.shape[0]
        m = x8.reshape([n * sc.rows, sc.subs, sc.sub])
        p = paddle.zeros([n * sc.rows, _K], dtype="int64")
        for q in range(sc.subs):
            part = paddle.cast(m[:, q, :], "float32").matmul(self._w32[q])
            p = p + paddle.cast(part, "int64")  # exact: every partial sum is below 2**24
        ab = (p.reshape([n, sc.rows * _K, 1]) * self._u).sum(axis=1)
        halves: Halves = paddle.bitwise_and(ab, self._m32).numpy().astype(np.int64)
        return halves

    def _halves_of(self, s: Ids) -> Halves:
        import paddle

        rows = paddle.index_select(self._words, self._index(s), axis=0)
        return self._halves(paddle.view(rows, "int8"))

    def _halves_range(self, start: int, stop: int) -> Halves:
        return self._halves(self._bytes8[start:stop])

    def _direct_to(self, other: _PoolBase, s: Ids, d: Ids) -> bool:
        import paddle

        if not (isinstance(other, PaddlePool) and other.device == self.device):
            return False
        rows = paddle.index_select(self._words, self._index(s), axis=0)
        other._words.scatter_(other._index(d), rows, overwrite=True)
        return True
