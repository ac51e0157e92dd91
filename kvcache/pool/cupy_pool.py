"""The cupy pool: CUDA devices, with a pinned numpy tier for the CPU side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.base import _PoolBase
from kvoracle.kvcache.pool.cupy_fingerprint import Dp4aFingerprint
from kvoracle.kvcache.pool.errors import DeviceUnavailable
from kvoracle.kvcache.pool.fingerprint import _K, _M32
from kvoracle.kvcache.pool.numpy_pool import NumpyPool
from kvoracle.kvcache.pool.protocol import U64, Bytes2D, Halves, Ids, Mask, PoolDType
from kvoracle.kvcache.pool.validation import _block_bytes, _cuda_index, _load


class _CupyArray(Protocol):
    """The part of cupy.ndarray this module uses (cupy itself is optional)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    def __getitem__(self, key: slice | int | tuple[slice | int, ...]) -> _CupyArray: ...
    def __setitem__(self, key: slice | _CupyArray, value: _CupyArray) -> None: ...
    def __and__(self, other: _CupyArray | int) -> _CupyArray: ...
    def __or__(self, other: _CupyArray) -> _CupyArray: ...
    def __rshift__(self, other: int) -> _CupyArray: ...
    def __mul__(self, other: _CupyArray) -> _CupyArray: ...
    def __add__(self, other: _CupyArray) -> _CupyArray: ...
    def reshape(self, *shape: int) -> _CupyArray: ...
    def view(self, dtype: object) -> _CupyArray: ...
    def astype(self, dtype: object) -> _CupyArray: ...
    def sum(self, axis: int) -> _CupyArray: ...
    def get(self) -> npt.NDArray[np.generic]: ...


class _CupyHostPool(NumpyPool):
    """A cupy backend's CPU tier: numpy over pinned memory, also addressable by kernels."""

    def __init__(
        self, num_blocks: int, block_size: int, heads: int, head_dim: int, dtype: PoolDType = "float16",
    ) -> None:
        cp = _load("cupy", "cupy")
        nbytes = num_blocks * _block_bytes(block_size, heads, head_dim, dtype)
        try:
            self._mem = cp.cuda.alloc_pinned_memory(nbytes)
        except cp.cuda.runtime.CUDARuntimeError as exc:  # no driver or no device
            raise DeviceUnavailable("cupy", f"cannot allocate pinned memory ({exc})") from exc
        buffer = np.frombuffer(self._mem, dtype=np.uint8, count=nbytes)
        buffer[:] = 0  # pinned memory comes uninitialised
        super().__init__(num_blocks, block_size, heads, head_dim, dtype, backend="cupy", buffer=buffer)
        self._cp = cp
        self._aliases: dict[int, _CupyArray] = {}

    def device_alias(self, index: int) -> _CupyArray:
        """The pool's words as a cupy array that kernels on device `index` read and write (UVA)."""
        if index not in self._aliases:
            cp, ptr = self._cp, self._rows.ctypes.data
            mem = cp.cuda.UnownedMemory(ptr, self._rows.nbytes, self._mem, index)
            shape = (self.num_blocks, self.block_bytes // self._word)
            self._aliases[index] = cp.ndarray(shape, dtype=self._np_word, memptr=cp.cuda.MemoryPointer(mem, 0))
        return self._aliases[index]


class CupyPool(_PoolBase):
    """cupy arrays on a CUDA device. Fingerprints use a CUDA kernel (cupy_fingerprint.py)
    where blocks are a multiple of 4,096 bytes, else exact float32 GEMMs (cuBLAS)."""

    _CHUNK_BYTES = 256 << 20  # the GEMMs' float32 temporaries are twice the chunk

    def __init__(
        self, device: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
        dtype: PoolDType = "float16",
    ) -> None:
        cp = _load("cupy", "cupy")
        super().__init__("cupy", device, num_blocks, block_size, heads, head_dim, dtype)
        self._cp, self._index_no = cp, _cuda_index(device)
        try:
            count = int(cp.cuda.runtime.getDeviceCount())
        except cp.cuda.runtime.CUDARuntimeError as exc:  # no driver or no device
            raise DeviceUnavailable("cupy", f"no CUDA device ({exc})") from exc
        if self._index_no >= count:
            raise DeviceUnavailable("cupy", f"no CUDA device {device} ({count} present)")
        with cp.cuda.Device(self._index_no):
            self.data: _CupyArray = cp.zeros(self.shape, dtype=dtype)
            raw = self.data.reshape(num_blocks, -1).view(cp.uint8)
            self._words: _CupyArray = raw.view(self._np_word)
            self._bytes8: _CupyArray = raw.view(cp.int8)
            self._w32: _CupyArray = cp.asarray(self._scheme.w32)
            self._u: _CupyArray = cp.asarray(self._scheme.u.reshape(1, -1, 2))
            self._kernel = Dp4aFingerprint.load(cp, self._scheme, self._index_no)
        self.fingerprint_path = "dp4a kernel" if self._kernel else "float32 GEMMs"
        if self._kernel:  # it keeps no temporaries the size of the chunk: fewer, longer launches
            self._chunk = max(1, (4 << 30) // self.block_bytes)

    def _take(self, words: _CupyArray, ids: Ids) -> _CupyArray:
        rows: _CupyArray = self._cp.take(words, self._cp.asarray(ids), axis=0)
        return rows

    def _copy_rows(self, s: Ids, d: Ids) -> None:
        with self._cp.cuda.Device(self._index_no):
            self._words[self._cp.asarray(d)] = self._take(self._words, s)

    def _gather_host(self, s: Ids) -> Bytes2D:
        with self._cp.cuda.Device(self._index_no):
            return self._take(self._words, s).get().view(np.uint8)

    def _scatter_host(self, d: Ids, rows: Bytes2D) -> None:
        cp = self._cp
        with cp.cuda.Device(self._index_no):
            self._words[cp.asarray(d)] = cp.asarray(rows.view(self._np_word))

    def _halves(self, x8: _CupyArray) -> _CupyArray:
        if self._kernel is not None:
            return self._kernel(x8)
        cp, sc, n = self._cp, self._scheme, x8.shape[0]
        m = x8.reshape(n * sc.rows, sc.subs, sc.sub)
        p: _CupyArray = cp.zeros((n * sc.rows, _K), dtype=cp.int64)
        for q in range(sc.subs):  # exact: every partial sum is an integer below 2**24
            p = p + cp.matmul(m[:, q, :].astype(cp.float32), self._w32[q]).astype(cp.int64)
        return (p.reshape(n, sc.rows * _K, 1) * self._u).sum(1) & _M32

    def _halves_of(self, s: Ids) -> Halves:
        with self._cp.cuda.Device(self._index_no):
            h: Halves = self._halves(self._take(self._words, s).view(self._cp.int8)).get().astype(np.int64)
            return h

    def _halves_range(self, start: int, stop: int) -> Halves:
        with self._cp.cuda.Device(self._index_no):
            h: Halves = self._halves(self._bytes8[start:stop]).get().astype(np.int64)
            return h

    def _mismatches(self, fp: U64, present: Mask) -> Ids:
        cp = self._cp
        with cp.cuda.Device(self._index_no):
            fpd: _CupyArray = cp.asarray(fp.view(np.int64))
            pres: _CupyArray = cp.asarray(present)
            hi, lo = (fpd >> 32) & _M32, fpd & _M32
            bad: _CupyArray = cp.zeros(self.num_blocks, dtype=cp.bool_)
            for a in range(0, self.num_blocks, self._chunk):
                b = min(self.num_blocks, a + self._chunk)
                if present[a:b].any():
                    h = self._halves(self._bytes8[a:b])
                    differ: _CupyArray = cp.not_equal(h[:, 0], hi[a:b]) | cp.not_equal(h[:, 1], lo[a:b])
                    bad[a:b] = differ & pres[a:b]
            ids: Ids = cp.flatnonzero(bad).get().astype(np.int64)
            return ids

    def _direct_to(self, other: _PoolBase, s: Ids, d: Ids) -> bool:
        cp = self._cp
        if isinstance(other, CupyPool) and other.device == self.device:
            dst = other._words
        elif isinstance(other, _CupyHostPool):
            dst = other.device_alias(self._index_no)  # swap out: the GPU writes host memory
        else:
            return False
        with cp.cuda.Device(self._index_no):
            dst[cp.asarray(d)] = self._take(self._words, s)
            cp.cuda.get_current_stream().synchronize()
        return True

    def _direct_from(self, source: _PoolBase, s: Ids, d: Ids) -> bool:
        if not isinstance(source, _CupyHostPool):
            return False
        cp = self._cp
        with cp.cuda.Device(self._index_no):
            rows = self._take(source.device_alias(self._index_no), s)  # swap in: the GPU reads host memory
            self._words[cp.asarray(d)] = rows
            cp.cuda.get_current_stream().synchronize()
        return True
