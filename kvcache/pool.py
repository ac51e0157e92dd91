"""The physical KV block pool: the bytes behind the block ids, on numpy, paddle, torch or cupy.

The bookkeeping (allocators, tree, heaps) names blocks; a pool holds their data,
`[num_blocks, block_size, heads, head_dim]` elements of one dtype on one device.
Every copy the lifecycle implies moves real bytes through a pool, and every block
can be fingerprinted where it lives, so a cache hit that returns the wrong data
(a use-after-free) shows up as a wrong fingerprint, not only as a wrong counter.

Copies are batched: one gather and one scatter per call, whatever the batch size.
Between a GPU pool and a pinned CPU pool of the same backend, the gather and the
scatter both run on the GPU and the side in host memory is addressed directly
(pinned memory is mapped into the device's address space), so no host-side loop
or extra staging copy stands between the two pools.

Fingerprint of a block of N bytes (the same integers on every backend, hence the
same 64 bits):

    s = the bytes as signed int8, in R rows of L = gcd(N, 4096) bytes
    P[r, k] = sum_j s[r*L + j] * W[j, k]            W: fixed int8 weights, K = 8
    A = sum_{r,k} P[r, k] * UA[r*K + k]             UA, UB: fixed positive weights
    B = sum_{r,k} P[r, k] * UB[r*K + k]
    fingerprint = (A mod 2**32) << 32 | (B mod 2**32)

Why it is exact on every backend: every step is integer arithmetic that cannot
overflow. |P| <= 4096 * 128 * 127 < 2**26, so int32 accumulators hold it; U is
bounded so that |A|, |B| < 2**62 in int64. A backend may compute P any way that
is exact: torch uses the int8 GEMM (int32 accumulation, one read of the pool);
numpy, paddle and cupy use float32 GEMMs over sub-rows of 512 bytes, whose every
partial sum is an integer below 2**24 and so exact in any summation order (also
with TF32 or bf16 inputs: int8 values and weights need at most 8 significant
bits). Exact integers do not depend on reduction order or on how a backend
promotes types, so fingerprints agree bit for bit. Nothing is ever read as a
float, so NaN payloads and flush-to-zero cannot change a fingerprint.

Why a one-bit change is always caught: a change of delta (0 < |delta| < 256) in
one byte changes A by delta * c, where c = sum_k W[j, k] * UA[r*K + k]; W[:, 0]
and UA[r*K] are odd and UA[r*K + k] is even for k > 0, so c is odd and delta * c
is never a multiple of 2**32.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Final, Literal, Protocol

import numpy as np
import numpy.typing as npt

from kvcache.errors import BlockOutOfRange, KVCacheError

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    import paddle

__all__ = [
    "BACKENDS", "BackendUnavailable", "BadFingerprint", "BatchMismatch", "BlockPool", "Blocks",
    "Bytes2D", "CupyPool", "DeviceUnavailable", "DuplicateBlock", "FingerprintTable",
    "GeometryError", "NumpyPool", "PaddlePool", "PayloadSizeError", "PoolDType", "PoolError",
    "PoolMismatch", "TorchPool", "UnknownBackend", "UnknownDevice", "content_fingerprints",
    "default_backend", "default_device", "make_pool", "seed_content", "seed_fingerprints",
]

PoolDType = Literal["float16", "float32"]
Bytes2D = npt.NDArray[np.uint8]
Ids = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Halves = npt.NDArray[np.int64]
# Block ids: a list from the scheduler, or an int64 array from a caller that has one.
Blocks = Sequence[int] | Ids

BACKENDS: Final = ("numpy", "paddle", "torch", "cupy")
MASK64: Final = (1 << 64) - 1
_M32: Final = 0xFFFF_FFFF
_GAMMA: Final = 0x9E37_79B9_7F4A_7C15  # splitmix64 increment
_W_KEY: Final = 0x6B76_6F72_6163_6C65  # fixed keys: the weights are part of the definition
_U_KEY: Final = 0x706F_6F6C_2D77_6569
_SEED_KEY: Final = 0x6669_6C6C_2D6B_7673
_ROW: Final = 4096  # bytes per first-stage row: keeps |P| < 2**26
_SUB: Final = 512  # bytes per float32 sub-row: keeps partial sums < 2**24
_K: Final = 8  # first-stage outputs per row (the int8 GEMM needs a multiple of 8)
_ITEMSIZE: Final[dict[str, int]] = {"float16": 2, "float32": 4}
_INSTALL: Final[dict[str, str]] = {
    "numpy": "pip install kvoracle",
    "paddle": "pip install 'kvoracle[paddle]' (paddlepaddle; paddlepaddle-gpu for a GPU)",
    "torch": "pip install 'kvoracle[torch]' (torch)",
    "cupy": "pip install 'kvoracle[cupy]' (cupy-cuda12x)",
}


# ---------------------------------------------------------------- errors


class PoolError(KVCacheError):
    """Bad input to a block pool. Raised before anything is written: the pool is unchanged."""


class UnknownBackend(PoolError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown KV backend {name!r}: choose one of {', '.join(BACKENDS)}")
        self.name = name


class UnknownDevice(PoolError):
    def __init__(self, device: str) -> None:
        super().__init__(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
        self.device = device


class GeometryError(PoolError):
    def __init__(self, why: str) -> None:
        super().__init__(why)


class BatchMismatch(PoolError):
    def __init__(self, what: str, left: int, right: int) -> None:
        super().__init__(f"{what}: {left} blocks but {right} partners")
        self.left = left
        self.right = right


class DuplicateBlock(PoolError):
    def __init__(self, label: str, block: int) -> None:
        super().__init__(f"{label}: block {block} appears twice among the destinations")
        self.block = block


class PayloadSizeError(PoolError):
    def __init__(self, label: str, got: object, want: int) -> None:
        super().__init__(f"{label}: payload of {got} where {want} bytes per block are needed")


class PoolMismatch(PoolError):
    def __init__(self, why: str) -> None:
        super().__init__(why)


class BadFingerprint(PoolError):
    def __init__(self, why: str) -> None:
        super().__init__(f"expected fingerprints must be ints in 0..2**64-1: {why}")


class BackendUnavailable(RuntimeError):
    """The backend's package is missing or cannot start; the message says what to install."""

    def __init__(self, backend: str, why: str) -> None:
        super().__init__(self._message(backend, why))
        self.backend = backend

    @staticmethod
    def _message(backend: str, why: str) -> str:
        return f"KV backend {backend!r} is unavailable: {why}; install with: {_INSTALL.get(backend, '?')}"


class DeviceUnavailable(BackendUnavailable):
    """The package is there, the device asked for is not (no CUDA device, wrong index)."""

    @staticmethod
    def _message(backend: str, why: str) -> str:
        return f"KV backend {backend!r} cannot use that device: {why}"


# ---------------------------------------------------------------- the protocol


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


# ---------------------------------------------------------------- the definition (numpy)


def _mix64(z: U64) -> U64:
    """splitmix64's finaliser; numpy uint64 arrays wrap silently, which is what it needs."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)
    return z ^ (z >> np.uint64(31))


def _stream(key: int, count: int) -> U64:
    steps = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GAMMA)
    return _mix64(np.uint64(key) + steps)


@dataclass(frozen=True, eq=False)
class _Scheme:
    """The fixed fingerprint weights for one block size (see the module docstring)."""

    row: int  # L
    sub: int  # float32 sub-row length, divides L
    rows: int  # R
    w8: npt.NDArray[np.int8]  # [L, K]
    w32: npt.NDArray[np.float32]  # [L // sub, sub, K], the same values
    u: npt.NDArray[np.int64]  # [R*K, 2]: columns UA, UB

    @property
    def subs(self) -> int:
        return self.row // self.sub


@functools.cache
def _scheme(block_bytes: int) -> _Scheme:
    row = math.gcd(block_bytes, _ROW)
    sub = math.gcd(row, _SUB)
    rows = block_bytes // row
    x = _stream(_W_KEY, row * _K).reshape(row, _K)
    mag = (x % np.uint64(127)).astype(np.int64) + 1
    mag[:, 0] |= 1  # odd first column: a one-byte change always shows (module docstring)
    sign = np.where((x >> np.uint64(7)) & np.uint64(1), -1, 1)
    w8 = (mag * sign).astype(np.int8)
    terms = rows * _K
    ubits = min(31, 36 - (terms - 1).bit_length())  # terms * 2**26 * 2**ubits <= 2**62
    if ubits < 2:
        raise GeometryError(f"blocks of {block_bytes} bytes are too large to fingerprint")
    y = _stream(_U_KEY, terms * 2).reshape(terms, 2) % np.uint64(1 << (ubits - 1))
    u = y.astype(np.int64) * 2 + 2  # even, in 2..2**ubits
    u[::_K] -= 1  # odd for k == 0
    w32 = w8.astype(np.float32).reshape(row // sub, sub, _K)
    return _Scheme(row, sub, rows, w8, w32, u)


def _np_halves(x8: npt.NDArray[np.int8], sc: _Scheme) -> Halves:
    """(A mod 2**32, B mod 2**32) per block of x8 [n, N], exactly as the definition says."""
    n = x8.shape[0]
    m = x8.reshape(n * sc.rows, sc.subs, sc.sub)
    p = np.zeros((n * sc.rows, _K), dtype=np.int64)
    for q in range(sc.subs):
        p += (m[:, q, :].astype(np.float32) @ sc.w32[q]).astype(np.int64)
    halves: Halves = (p.reshape(n, sc.rows * _K) @ sc.u) & _M32
    return halves


def _finish(h: Halves) -> list[int]:
    fp = (h[:, 0].astype(np.uint64) << np.uint64(32)) | h[:, 1].astype(np.uint64)
    out: list[int] = fp.tolist()
    return out


def _differs(h: Halves, fp: U64) -> Mask:
    hi = (fp >> np.uint64(32)).astype(np.int64)
    lo = (fp & np.uint64(_M32)).astype(np.int64)
    bad: Mask = (h[:, 0] != hi) | (h[:, 1] != lo)
    return bad


def seed_content(seeds: Sequence[int], block_bytes: int) -> Bytes2D:
    """The bytes fill() writes: a pure function of (seed mod 2**64, block_bytes).

    splitmix64 words, little-endian; bit 6 of every odd byte is cleared so that each
    16-bit (and 32-bit) lane, read as a float, is finite: a stand-in for real
    activations that never turns into NaN or inf.
    """
    s = np.array([int(x) & MASK64 for x in seeds], dtype=np.uint64)
    base = _mix64(s ^ np.uint64(_SEED_KEY))
    steps = np.arange(1, -(-block_bytes // 8) + 1, dtype=np.uint64) * np.uint64(_GAMMA)
    words = _mix64(base[:, None] + steps[None, :]).astype("<u8")
    rows = np.ascontiguousarray(words.view(np.uint8)[:, :block_bytes])
    rows[:, 1::2] &= np.uint8(0xBF)
    return rows


def content_fingerprints(rows: Bytes2D) -> list[int]:
    """Fingerprints of host bytes (rows of one block each): the reference every pool matches."""
    if rows.ndim != 2 or rows.dtype != np.uint8:
        raise PayloadSizeError("content_fingerprints", f"{rows.dtype} {rows.shape}", -1)
    return _finish(_np_halves(np.ascontiguousarray(rows).view(np.int8), _scheme(rows.shape[1])))


def seed_fingerprints(seeds: Sequence[int], block_bytes: int) -> list[int]:
    """What fingerprints() returns for blocks filled with these seeds."""
    if not seeds:
        return []
    return content_fingerprints(seed_content(seeds, block_bytes))


# ---------------------------------------------------------------- expected fingerprints


class FingerprintTable(MutableMapping[int, int]):
    """Expected fingerprint per block id, kept in arrays so audit() needs no Python loop.

    A shadow checker updates entries as blocks are written and audits the whole pool
    in one call; a plain dict works too, at the cost of converting it on every audit.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._fp = np.zeros(num_blocks, dtype=np.uint64)
        self._present = np.zeros(num_blocks, dtype=np.bool_)
        self._count = 0

    def _check(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise BlockOutOfRange("fingerprint table", block, self.num_blocks)
        return block

    def __getitem__(self, block: int) -> int:
        if not (0 <= block < self.num_blocks and self._present[block]):
            raise KeyError(block)
        return int(self._fp[block])

    def __setitem__(self, block: int, fingerprint: int) -> None:
        self._check(block)
        if not 0 <= fingerprint <= MASK64:
            raise BadFingerprint(f"block {block}: {fingerprint}")
        self._count += not self._present[block]
        self._fp[block] = fingerprint
        self._present[block] = True

    def __delitem__(self, block: int) -> None:
        if not (0 <= block < self.num_blocks and self._present[block]):
            raise KeyError(block)
        self._present[block] = False
        self._count -= 1

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self._present).tolist())

    def __len__(self) -> int:
        return self._count

    def set_many(self, blocks: Blocks, fingerprints: Sequence[int] | U64) -> None:
        """Vectorised __setitem__."""
        ids = _as_ids(blocks)
        if len(fingerprints) != ids.size:
            raise BatchMismatch("fingerprint table", ids.size, len(fingerprints))
        _check_range(ids, "fingerprint table", self.num_blocks)
        self._fp[ids] = _as_fingerprints(fingerprints)
        self._present[ids] = True
        self._count = int(self._present.sum())

    def arrays(self) -> tuple[U64, Mask]:
        """(fingerprint, present) per block id; read-only views."""
        fp, present = self._fp.view(), self._present.view()
        fp.flags.writeable = present.flags.writeable = False
        return fp, present


def _as_fingerprints(values: Sequence[int] | U64) -> U64:
    if isinstance(values, np.ndarray) and values.dtype == np.uint64:
        return values
    try:
        return np.fromiter(values, dtype=np.uint64, count=len(values))
    except (OverflowError, TypeError, ValueError) as exc:
        raise BadFingerprint(str(exc)) from exc


def _expected_arrays(expected: Mapping[int, int], n: int, label: str) -> tuple[U64, Mask]:
    if isinstance(expected, FingerprintTable) and expected.num_blocks == n:
        return expected.arrays()
    fp = np.zeros(n, dtype=np.uint64)
    present = np.zeros(n, dtype=np.bool_)
    if expected:
        ids = np.fromiter(expected.keys(), dtype=np.int64, count=len(expected))
        _check_range(ids, label, n)
        fp[ids] = _as_fingerprints(list(expected.values()))
        present[ids] = True
    return fp, present


# ---------------------------------------------------------------- validation


def _as_ids(blocks: Blocks) -> Ids:
    ids = np.asarray(blocks, dtype=np.int64)
    if ids.ndim != 1:
        raise PoolMismatch(f"block ids must be a flat sequence, got shape {ids.shape}")
    return ids


def _check_range(ids: Ids, label: str, size: int) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= size):
        bad = ids[(ids < 0) | (ids >= size)][0]
        raise BlockOutOfRange(label, int(bad), size)


def _check_distinct(ids: Ids, label: str) -> None:
    if ids.size > 1:
        ordered = np.sort(ids)
        same = ordered[1:] == ordered[:-1]
        if same.any():
            raise DuplicateBlock(label, int(ordered[1:][same][0]))


def _normalize_device(device: str) -> str:
    d = device.strip().lower()
    if d == "cpu":
        return d
    kind, _, index = d.partition(":")
    if kind in ("cuda", "gpu") and (index == "" or index.isdigit()):
        return f"cuda:{int(index or 0)}"
    raise UnknownDevice(device)


def _cuda_index(device: str) -> int:
    return int(device.partition(":")[2])


def _block_bytes(block_size: int, heads: int, head_dim: int, dtype: str) -> int:
    for name, value in (("block_size", block_size), ("heads", heads), ("head_dim", head_dim)):
        if value < 1:
            raise GeometryError(f"{name} must be positive, got {value}")
    if dtype not in _ITEMSIZE:
        raise GeometryError(f"dtype {dtype!r} is not one of {sorted(_ITEMSIZE)}")
    size = block_size * heads * head_dim * _ITEMSIZE[dtype]
    if size % 4:
        raise GeometryError(f"a block must be a whole number of 32-bit words, got {size} bytes")
    return size


def _load(backend: str, module: str) -> ModuleType:
    """Import a backend's package on first use, so that numpy users never pay for it."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
            return importlib.import_module(module)
    except (ImportError, OSError) as exc:
        raise BackendUnavailable(backend, f"cannot import {module} ({exc})") from exc


# ---------------------------------------------------------------- the shared shell


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


# ---------------------------------------------------------------- numpy (the reference)


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


# ---------------------------------------------------------------- paddle


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


# ---------------------------------------------------------------- torch


class _Tensor(Protocol):
    """The part of torch.Tensor this module uses (torch itself is optional)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    def __getitem__(self, key: slice | int | tuple[slice | int, ...]) -> _Tensor: ...
    def __setitem__(self, key: slice, value: _Tensor) -> None: ...
    def __and__(self, other: _Tensor | int) -> _Tensor: ...
    def __or__(self, other: _Tensor) -> _Tensor: ...
    def __rshift__(self, other: int) -> _Tensor: ...
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


def _torch_w8(torch: ModuleType, device: str, w8: npt.NDArray[np.int8]) -> _Tensor:
    """The int8 weights column-major: both GEMM operands then have K contiguous ("TN"),
    the layout int8 tensor-core kernels are built for."""
    t: _Tensor = torch.from_numpy(np.asfortranarray(w8).T).to(device)
    return t.t()


_INT_MM_EXACT: dict[tuple[str, int], bool] = {}


def _torch_int_mm_exact(torch: ModuleType, device: str, w8: _Tensor, row: int) -> bool:
    """Whether torch._int_mm runs here with these weights and returns the exact integers."""
    if (device, row) not in _INT_MM_EXACT:
        x = np.random.default_rng(row).integers(-128, 128, size=(32, row), dtype=np.int8)
        want = x.astype(np.int64) @ _scheme(row).w8.astype(np.int64)  # a `row`-byte block has L == row
        try:
            got = torch._int_mm(torch.from_numpy(x).to(device), w8).cpu().numpy()
            _INT_MM_EXACT[device, row] = bool(np.array_equal(got, want))
        except (RuntimeError, AttributeError, TypeError, NotImplementedError):
            _INT_MM_EXACT[device, row] = False
    return _INT_MM_EXACT[device, row]


class TorchPool(_PoolBase):
    """torch tensors on a CUDA device, or in (pinned, where CUDA is present) host memory.

    Rows move as int64 words. Fingerprints use torch._int_mm (int8 GEMM, int32
    accumulation): the pool is read once, by tensor cores on a GPU.
    """

    def _chunk_bytes(self) -> int:
        return 64 << 20 if self.device == "cpu" else 1 << 30  # a GPU reads a GiB in a fraction of a ms

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
        self._w8 = _torch_w8(torch, device, sc.w8)
        self._w32: _Tensor = torch.from_numpy(sc.w32).to(device)
        self._u: _Tensor = torch.from_numpy(sc.u.reshape(1, -1, 2)).to(device)
        self._int_mm = _torch_int_mm_exact(torch, device, self._w8, sc.row)
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
        m = x8.reshape(n * sc.rows, sc.row)
        if self._int_mm and n * sc.rows > 16:  # _int_mm wants more than 16 rows
            p: _Tensor = torch._int_mm(m, self._w8).to(torch.int64)
        else:  # exact float32 sub-row GEMMs, as numpy does them
            mm = m.reshape(n * sc.rows, sc.subs, sc.sub)
            p = torch.zeros((n * sc.rows, _K), dtype=torch.int64, device=self.device)
            for q in range(sc.subs):
                p = p + torch.matmul(mm[:, q, :].to(torch.float32), self._w32[q]).to(torch.int64)
        return (p.reshape(n, sc.rows * _K, 1) * self._u).sum(1) & _M32

    def _host_halves(self, x8: _Tensor) -> Halves:
        h: Halves = self._halves(x8).cpu().numpy().astype(np.int64)
        return h

    def _halves_of(self, s: Ids) -> Halves:
        return self._host_halves(self._words.index_select(0, self._index(s)).view(self._torch.int8))

    def _halves_range(self, start: int, stop: int) -> Halves:
        return self._host_halves(self._bytes8[start:stop])

    def _mismatches(self, fp: U64, present: Mask) -> Ids:
        """Compared on the device; only the ids that differ come back (one sync)."""
        torch = self._torch
        fpd = torch.from_numpy(fp.view(np.int64).copy()).to(self.device)
        pres = torch.from_numpy(present.copy()).to(self.device)
        hi, lo = (fpd >> 32) & _M32, fpd & _M32
        bad: _Tensor = torch.zeros(self.num_blocks, dtype=torch.bool, device=self.device)
        for a in range(0, self.num_blocks, self._chunk):
            b = min(self.num_blocks, a + self._chunk)
            if present[a:b].any():
                h = self._halves(self._bytes8[a:b])
                differ = torch.ne(h[:, 0], hi[a:b]) | torch.ne(h[:, 1], lo[a:b])
                bad[a:b] = differ & pres[a:b]
        ids: Ids = torch.nonzero(bad).flatten().cpu().numpy().astype(np.int64)
        return ids

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


# ---------------------------------------------------------------- cupy


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
    """cupy arrays on a CUDA device. Fingerprints use exact float32 GEMMs (cuBLAS)."""

    _CHUNK_BYTES = 256 << 20

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


# ---------------------------------------------------------------- selection


def default_backend() -> str:
    """The backend named by KV_BACKEND (numpy when unset)."""
    name = os.environ.get("KV_BACKEND", "").strip().lower() or "numpy"
    if name not in BACKENDS:
        raise UnknownBackend(name)
    return name


def default_device(backend: str) -> str:
    """Where a backend's GPU tier goes: 'cuda:0' when it sees a CUDA device, else 'cpu'."""
    name = backend.strip().lower()
    if name == "numpy":
        return "cpu"
    if name == "paddle":
        _load_paddle()
        import paddle

        return "cuda:0" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    if name == "torch":
        return "cuda:0" if _load("torch", "torch").cuda.is_available() else "cpu"
    if name == "cupy":
        return "cuda:0"  # cupy has no CPU arrays
    raise UnknownBackend(backend)


def make_pool(
    backend: str, device: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
    *, dtype: PoolDType = "float16", pinned: bool = True,
) -> BlockPool:
    """A zeroed pool. `pinned` puts a torch CPU pool in page-locked memory when CUDA is there.

    Raises UnknownBackend, UnknownDevice, GeometryError, or BackendUnavailable (with
    the package to install) / DeviceUnavailable.
    """
    name, dev = backend.strip().lower(), _normalize_device(device)
    if name == "numpy":
        if dev != "cpu":
            raise DeviceUnavailable("numpy", f"numpy keeps pools in host memory, not on {dev}")
        return NumpyPool(num_blocks, block_size, heads, head_dim, dtype)
    if name == "paddle":
        return PaddlePool(dev, num_blocks, block_size, heads, head_dim, dtype)
    if name == "torch":
        return TorchPool(dev, num_blocks, block_size, heads, head_dim, dtype, pinned=pinned)
    if name == "cupy":
        if dev == "cpu":
            return _CupyHostPool(num_blocks, block_size, heads, head_dim, dtype)
        return CupyPool(dev, num_blocks, block_size, heads, head_dim, dtype)
    raise UnknownBackend(backend)
