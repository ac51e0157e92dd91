"""Fingerprint of a block of N bytes (the same integers on every backend, hence the
same 64 bits):

    s = the bytes as signed int8, in R rows of L = gcd(N, 4096) bytes
    P[r, k] = sum_j s[r*L + j] * W[j, k]            W: fixed int8 weights, K = 8
    A = sum_{r,k} P[r, k] * UA[r*K + k]             UA, UB: fixed positive weights
    B = sum_{r,k} P[r, k] * UB[r*K + k]
    fingerprint = (A mod 2**32) << 32 | (B mod 2**32)

Why it is exact on every backend: every step is integer arithmetic that cannot
overflow. |P| <= 4096 * 128 * 127 < 2**26, so int32 accumulators hold it; U is
bounded so that |A|, |B| < 2**62 in int64. A backend may compute P any way that
is exact: torch uses the int8 GEMM (int32 accumulation, one read of the pool); cupy
a CUDA kernel with int8 dot products (cupy_fingerprint.py) where L is 4096;
numpy, paddle and otherwise cupy use float32 GEMMs over sub-rows of 512 bytes, whose every
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
import math
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from kvoracle.kvcache.errors import BlockOutOfRange

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.errors import (
    BadFingerprint,
    BatchMismatch,
    GeometryError,
    PayloadSizeError,
)
from kvoracle.kvcache.pool.protocol import U64, Blocks, Bytes2D, Halves, Mask
from kvoracle.kvcache.pool.validation import _as_ids, _check_range

MASK64: Final = (1 << 64) - 1
_M32: Final = 0xFFFF_FFFF
_GAMMA: Final = 0x9E37_79B9_7F4A_7C15  # splitmix64 increment
_W_KEY: Final = 0x6B76_6F72_6163_6C65  # fixed keys: the weights are part of the definition
_U_KEY: Final = 0x706F_6F6C_2D77_6569
_SEED_KEY: Final = 0x6669_6C6C_2D6B_7673
_ROW: Final = 4096  # bytes per first-stage row: keeps |P| < 2**26
_SUB: Final = 512  # bytes per float32 sub-row: keeps partial sums < 2**24
_K: Final = 8  # first-stage outputs per row (the int8 GEMM needs a multiple of 8)


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
