"""The torch pool: CUDA devices, or (pinned) host memory.
"""

from __future__ import annotations

import math
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.base import _PoolBase
from kvoracle.kvcache.pool.errors import DeviceUnavailable
from kvoracle.kvcache.pool.fingerprint import _K, _M32, _scheme
from kvoracle.kvcache.pool.protocol import U64, Bytes2D, Halves, Ids, Mask, PoolDType
from kvoracle.kvcache.pool.validation import _cuda_index, _load


class _Tensor(Protocol):
    """The part of torch.Tensor this module uses (torch itself is optional)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    def __getitem__(self, key: slice | int | tuple[slice | int, ...]) -> _Tensor: ...
    def __setitem__(self, key: slice, value: _Tensor) -> None: ...
    def __and__(self, other: _Tensor | int) -> _Tensor: ...
    def __or__(self, other: _Tensor) -> _Tensor: ...
    def __rshift__(self, other: int) -> _Tensor: ...
    def __lshift__(self, other: int) -> _Tensor: ...
    def __mul__(self, other: _Tensor) -> _Tensor: ...
    def __add__(self, other: _Tensor) -> _Tensor: ...
    def reshape(self, *shape: int) -> _Tensor: ...
    def view(self, dtype: object) -> _Tensor: ...
    def index_select(self, dim: int, index: _Tensor) -> _Tensor: ...
    def index_copy_(self, dim: int, index: _Tensor, source: _Tensor) -> _Tensor: ...
    def sum(self, dim: int) -> _Tensor: ...
    def to(self, target: object) -> _Tensor: ...
    def cpu(self) -> _Tensor: ...
    def numpy(self) -> npt.NDArray[np.generic]: ...
    def data_ptr(self) -> int: ...
    def flatten(self) -> _Tensor: ...
    def t(self) -> _Tensor: ...


class _CudaArrayView:
    """Host memory described by __cuda_array_interface__, so a CUDA library can wrap it.

    Pinned memory lives in the device's unified address space (UVA): a kernel can
    read and write it at its host address, which is what a swap between a GPU pool
    and a pinned CPU pool uses to gather and scatter on the GPU in one pass.
    """

    def __init__(self, owner: object, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.owner = owner  # keeps the host memory alive as long as the view
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3, "strides": None,
        }


def _diagonal(rows: int) -> int:
    """Rows of the scheme fed to one GEMM row (D): each GEMM row then reads D * L bytes
    against D copies of the weights along the diagonal. On an H200 the int8 GEMM reads
    the pool at 3.6 TB/s so, against 2.7 TB/s with one row of L bytes and K outputs
    (docs/gpu.md)."""
    return math.gcd(rows, 4)


def _torch_w8(torch: ModuleType, device: str, w8: npt.NDArray[np.int8], diagonal: int) -> _Tensor:
    """The int8 weights, `diagonal` copies along the diagonal, column-major: both GEMM
    operands then have K contiguous ("TN"), the layout int8 tensor-core kernels are built for."""
    row = w8.shape[0]
    w = np.zeros((diagonal * row, diagonal * _K), dtype=np.int8)
    for i in range(diagonal):
        w[i * row:(i + 1) * row, i * _K:(i + 1) * _K] = w8
    t: _Tensor = torch.from_numpy(np.asfortranarray(w).T).to(device)
    return t.t()


_HALF = 16  # bits of each part of a split second-stage weight


def _split_weights(torch: ModuleType, device: str, u: npt.NDArray[np.int64]) -> _Tensor | None:
    """The second stage's weights [R*K, 2] as float64 columns (UA mod 2**16, UB mod 2**16,
    UA >> 16, UB >> 16), or None where a float64 GEMM by them could round.

    |P| < 2**26 and each part is below 2**16, so every product and every partial sum of
    R*K of them is an integer below 2**53 while R*K <= 2**11 (blocks up to 1 MiB): the
    GEMM is exact in any order, and A = lo + (hi << 16) is the definition's integer. One
    small GEMM reads P once, where the int64 products made three temporaries of it."""
    if len(u) > 1 << 11:
        return None
    parts = np.concatenate([u & ((1 << _HALF) - 1), u >> _HALF], axis=1).astype(np.float64)
    t: _Tensor = torch.from_numpy(parts).to(device)
    return t


_INT_MM_EXACT: dict[tuple[str, int, int], bool] = {}


def _torch_int_mm_exact(torch: ModuleType, device: str, w8: _Tensor, row: int, diagonal: int) -> bool:
    """Whether torch._int_mm runs here with these weights and returns the exact integers."""
    if (device, row, diagonal) not in _INT_MM_EXACT:
        x = np.random.default_rng(row).integers(-128, 128, size=(32, diagonal * row), dtype=np.int8)
        want = x.reshape(32 * diagonal, row).astype(np.int64) @ _scheme(row).w8.astype(np.int64)
        try:
            got = torch._int_mm(torch.from_numpy(x).to(device), w8).cpu().numpy().reshape(32 * diagonal, _K)
            _INT_MM_EXACT[device, row, diagonal] = bool(np.array_equal(got, want))
        except (RuntimeError, AttributeError, TypeError, NotImplementedError):
            _INT_MM_EXACT[device, row, diagonal] = False
    return _INT_MM_EXACT[device, row, diagonal]


class TorchPool(_PoolBase):
    """torch tensors on a CUDA device, or in (pinned, where CUDA is present) host memory.

    Rows move as int64 words. Fingerprints use torch._int_mm (int8 GEMM, int32
    accumulation): the pool is read once, by tensor cores on a GPU.
    """

    def _chunk_bytes(self) -> int:
        return 64 << 20 if self.device == "cpu" else 4 << 30  # a GPU reads 4 GiB in about a ms

    def __init__(
        self, device: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
        dtype: PoolDType = "float16", *, pinned: bool = True,
    ) -> None:
        torch = _load("torch", "torch")
        super().__init__("torch", device, num_blocks, block_size, heads, head_dim, dtype)
        cuda = bool(torch.cuda.is_available())
        if device != "cpu" and not (cuda and _cuda_index(device) < torch.cuda.device_count()):
            raise DeviceUnavailable("torch", f"no CUDA device {device} (torch.cuda.is_available() is {cuda})")
        self._torch = torch
        self.pinned = pinned and device == "cpu" and cuda
        self.data: _Tensor = torch.zeros(
            self.shape, dtype=getattr(torch, dtype), device=device, pin_memory=self.pinned
        )
        raw = self.data.view(torch.uint8).reshape(num_blocks, self.block_bytes)
        self._words: _Tensor = raw.view(torch.int64 if self._word == 8 else torch.int32)
        self._bytes8: _Tensor = raw.view(torch.int8)
        sc = self._scheme
        self._diagonal = _diagonal(sc.rows)
        self._w8 = _torch_w8(torch, device, sc.w8, self._diagonal)
        self._w32: _Tensor = torch.from_numpy(sc.w32).to(device)
        self._u: _Tensor = torch.from_numpy(sc.u.reshape(1, -1, 2)).to(device)
        self._u_split = _split_weights(torch, device, sc.u)
        self._int_mm = _torch_int_mm_exact(torch, device, self._w8, sc.row, self._diagonal)
        self.fingerprint_path = "int8 GEMM (torch._int_mm)" if self._int_mm else "float32 GEMMs"
        self._aliases: dict[str, _Tensor | None] = {}

    def _index(self, ids: Ids, device: str | None = None) -> _Tensor:
        t: _Tensor = self._torch.as_tensor(ids, device=device or self.device)
        return t

    def _sync(self, device: str) -> None:
        if device != "cpu":
            self._torch.cuda.synchronize(device)

    def _copy_rows(self, s: Ids, d: Ids) -> None:
        self._words.index_copy_(0, self._index(d), self._words.index_select(0, self._index(s)))

    def _gather_host(self, s: Ids) -> Bytes2D:
        rows = self._words.index_select(0, self._index(s)).cpu().numpy()
        return rows.view(np.uint8)

    def _scatter_host(self, d: Ids, rows: Bytes2D) -> None:
        words = self._torch.from_numpy(rows.view(self._np_word)).to(self.device)
        self._words.index_copy_(0, self._index(d), words)

    def _halves(self, x8: _Tensor) -> _Tensor:
        """(A, B) mod 2**32 per row of x8 [n, N], left on the device."""
        torch, sc, n = self._torch, self._scheme, x8.shape[0]
        d = self._diagonal
        if self._int_mm and n * sc.rows > 16 * d:  # _int_mm wants more than 16 rows
            p: _Tensor = torch._int_mm(x8.reshape(n * sc.rows // d, d * sc.row), self._w8).reshape(n * sc.rows, _K)
        else:  # exact float32 sub-row GEMMs, as numpy does them
            mm = x8.reshape(n * sc.rows, sc.subs, sc.sub)
            p = torch.zeros((n * sc.rows, _K), dtype=torch.int64, device=self.device)
            for q in range(sc.subs):
                p = p + torch.matmul(mm[:, q, :].to(torch.float32), self._w32[q]).to(torch.int64)
        if self._u_split is None:
            return (p.reshape(n, sc.rows * _K, 1) * self._u).sum(1) & _M32
        s: _Tensor = torch.matmul(p.reshape(n, sc.rows * _K).to(torch.float64), self._u_split).to(torch.int64)
        return (s[:, :2] + (s[:, 2:] << _HALF)) & _M32

    def _host_halves(self, x8: _Tensor) -> Halves:
        h: Halves = self._halves(x8).cpu().numpy().astype(np.int64)
        return h

    def _halves_of(self, s: Ids) -> Halves:
        return self._host_halves(self._words.index_select(0, self._index(s)).view(self._torch.int8))

    def _halves_range(self, start: int, stop: int) -> Halves:
        return self._host_halves(self._bytes8[start:stop])

    def _mismatches(self, fp: U64, present: Mask) -> Ids:
        """Compared on the device; only the ids that differ come back (one sync). Every
        chunk's fingerprints are queued first, so that on a GPU the expected ones travel
        to it (on a stream of their own) while the pool is read."""
        torch = self._torch
        halves: _Tensor = torch.zeros((self.num_blocks, 2), dtype=torch.int64, device=self.device)
        for a in range(0, self.num_blocks, self._chunk):
            b = min(self.num_blocks, a + self._chunk)
            if present[a:b].any():  # a chunk with nothing expected is not read (its rows stay 0, unused)
                halves[a:b] = self._halves(self._bytes8[a:b])
        fpd, pres = self._upload(fp.view(np.int64), present)
        differ = torch.ne(halves[:, 0], (fpd >> 32) & _M32) | torch.ne(halves[:, 1], fpd & _M32)
        ids: Ids = torch.nonzero(differ & pres).flatten().cpu().numpy().astype(np.int64)
        return ids

    def _upload(self, *arrays: npt.NDArray[np.generic]) -> list[_Tensor]:
        """Host arrays (read-only views: read once, on their way) on the pool's device; on
        a GPU through a side stream that the current one then waits for."""
        torch = self._torch
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            if self.device == "cpu":
                return [torch.from_numpy(x) for x in arrays]
            side = torch.cuda.Stream(self.device)
            with torch.cuda.stream(side):
                out = [torch.from_numpy(x).to(self.device, non_blocking=True) for x in arrays]
            torch.cuda.current_stream(self.device).wait_stream(side)
            return out

    def cuda_alias(self, device: str) -> _Tensor | None:
        """This pinned CPU pool's words as a tensor on `device` (no copy), or None."""
        if not self.pinned:
            return None
        if device not in self._aliases:
            self._aliases[device] = self._make_alias(device)
        return self._aliases[device]

    def _make_alias(self, device: str) -> _Tensor | None:
        typestr = "<i8" if self._word == 8 else "<i4"
        view = _CudaArrayView(self._words, self._words.data_ptr(), tuple(self._words.shape), typestr)
        try:
            alias: _Tensor = self._torch.as_tensor(view, device=device)
        except (RuntimeError, TypeError, ValueError):
            return None
        return alias if alias.data_ptr() == self._words.data_ptr() else None  # a copy is no alias

    def _direct_to(self, other: _PoolBase, s: Ids, d: Ids) -> bool:
        if not isinstance(other, TorchPool):
            return False
        if self.device == other.device:
            src, dst, where = self._words, other._words, self.device
        elif other.device == "cpu" and (alias := other.cuda_alias(self.device)) is not None:
            src, dst, where = self._words, alias, self.device  # swap out: GPU writes host memory
        elif self.device == "cpu" and (alias := self.cuda_alias(other.device)) is not None:
            src, dst, where = alias, other._words, other.device  # swap in: GPU reads host memory
        else:
            return False
        dst.index_copy_(0, self._index(d, where), src.index_select(0, self._index(s, where)))
        self._sync(where)  # host memory may be reused the moment we return
        return True
