"""The physical block pool on every backend: bytes move exactly, fingerprints agree bit for bit.

numpy and paddle (CPU) run everywhere; torch and cupy cases skip, saying why, unless the
package is installed and (for 'cuda') a CUDA device is present. KV_BACKEND=NAME keeps
only that backend's cases (bench/gpu_check.py runs this file that way for torch and cupy);
the numpy reference functions are the yardstick in every case.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import numpy as np
import pytest

from kvoracle.kvcache.errors import BlockOutOfRange
from kvoracle.kvcache.pool import (
    BackendUnavailable,
    BadFingerprint,
    BatchMismatch,
    BlockPool,
    Bytes2D,
    DeviceUnavailable,
    DuplicateBlock,
    FingerprintTable,
    PayloadSizeError,
    PoolMismatch,
    UnknownBackend,
    UnknownDevice,
    content_fingerprints,
    default_backend,
    make_pool,
    seed_content,
    seed_fingerprints,
)

ALL_CASES = [("numpy", "cpu"), ("paddle", "cpu"), ("torch", "cpu"), ("torch", "cuda"), ("cupy", "cuda")]
# A fast tier and the CPU tier it swaps with, per backend.
ALL_TIERS = [("numpy", "cpu"), ("paddle", "cpu"), ("torch", "cpu"), ("torch", "cuda"), ("cupy", "cuda")]
_CHOSEN = os.environ.get("KV_BACKEND", "").strip().lower()
CASES = [c for c in ALL_CASES if not _CHOSEN or c[0] == _CHOSEN]
TIERS = [c for c in ALL_TIERS if not _CHOSEN or c[0] == _CHOSEN]

Geometry = tuple[int, int, int]  # block_size, heads, head_dim (fp16)
SMALL: Geometry = (4, 2, 16)  # 256 bytes: one row
ODD: Geometry = (3, 2, 16)  # 192 bytes: three rows of 64
BIG: Geometry = (16, 8, 128)  # 32 KiB: eight rows of 4096, a realistic block
TINY: Geometry = (1, 1, 6)  # 12 bytes: not a whole number of 8-byte words


def _ids(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


def pool_or_skip(backend: str, device: str, num_blocks: int, geometry: Geometry = ODD) -> BlockPool:
    if backend in ("torch", "cupy"):
        pytest.importorskip(backend, reason=f"{backend} is not installed (pip install 'kvoracle[{backend}]')")
    try:
        return make_pool(backend, device, num_blocks, *geometry)
    except DeviceUnavailable as exc:
        pytest.skip(f"no such device here: {exc}")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


def random_rows(n: int, block_bytes: int, seed: int = 0) -> Bytes2D:
    return np.random.default_rng(seed).integers(0, 256, size=(n, block_bytes), dtype=np.uint8)


def all_rows(pool: BlockPool) -> Bytes2D:
    return pool.read_rows(list(range(pool.num_blocks)))


def python_fingerprint(content: bytes) -> int:
    """The definition in kvcache/pool/fingerprint.py, in plain Python integers, as an independent check."""
    from kvoracle.kvcache.pool.fingerprint import _K, _scheme

    sc = _scheme(len(content))
    s = np.frombuffer(content, dtype=np.int8).tolist()
    w = sc.w8.tolist()
    u = sc.u.tolist()
    a = b = 0
    for r in range(sc.rows):
        for k in range(_K):
            p = sum(s[r * sc.row + j] * w[j][k] for j in range(sc.row))
            a += p * u[r * _K + k][0]
            b += p * u[r * _K + k][1]
    assert abs(a) < 2**63 and abs(b) < 2**63  # the no-overflow bound the backends rely on
    return (a % 2**32) << 32 | (b % 2**32)


# ---------------------------------------------------------------- the definition


@pytest.mark.parametrize("geometry", [SMALL, ODD, BIG], ids=["small", "odd", "big"])
def test_fingerprint_matches_python_integers(geometry: Geometry) -> None:
    n = geometry[0] * geometry[1] * geometry[2] * 2
    rows = np.concatenate([
        random_rows(1, n), np.full((1, n), 0x80, np.uint8), np.full((1, n), 0x7F, np.uint8),
        np.zeros((1, n), np.uint8),
    ])
    assert content_fingerprints(rows) == [python_fingerprint(r.tobytes()) for r in rows]


def test_seed_content_is_pinned_and_finite() -> None:
    # Changing these values changes the definition: every stored expected fingerprint breaks.
    assert seed_fingerprints([0, 1, 2**64 - 1], 256) == seed_fingerprints([2**64, 1, -1], 256)
    first = seed_content([0], 256)
    assert first.tobytes() == seed_content([0], 256).tobytes()
    assert first.tobytes()[:8].hex() == GOLDEN_SEED0_PREFIX
    assert seed_fingerprints([0, 7], 256) == GOLDEN_FINGERPRINTS
    halves = seed_content(list(range(64)), 32768).view(np.float16)
    assert np.isfinite(halves).all()


GOLDEN_SEED0_PREFIX = "49823b0bb49d6020"
GOLDEN_FINGERPRINTS = [1067768257295137896, 8566060852876938539]


# ---------------------------------------------------------------- every backend


@pytest.mark.parametrize("geometry", [ODD, TINY], ids=["odd", "tiny"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fill_read_write_round_trip(case: tuple[str, str], geometry: Geometry) -> None:
    pool = pool_or_skip(*case, num_blocks=8, geometry=geometry)
    pool.fill([1, 3, 5], [10, 20, 30])
    want = seed_content([10, 20, 30], pool.block_bytes)
    assert [pool.read(b) for b in (1, 3, 5)] == [r.tobytes() for r in want]
    assert pool.read(0) == bytes(pool.block_bytes)
    payloads = [r.tobytes() for r in random_rows(2, pool.block_bytes)]
    pool.write([0, 2], payloads)
    assert [pool.read(0), pool.read(2)] == payloads
    rows = random_rows(3, pool.block_bytes, seed=1)
    pool.write_rows([7, 6, 4], rows)
    assert np.array_equal(pool.read_rows([7, 6, 4]), rows)
    assert pool.fingerprints([1, 3, 5]) == seed_fingerprints([10, 20, 30], pool.block_bytes)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_copy_within_pool_reads_all_sources_first(case: tuple[str, str]) -> None:
    pool = pool_or_skip(*case, num_blocks=8)
    pool.fill(list(range(8)), list(range(100, 108)))
    before = all_rows(pool)
    pool.copy([0, 1, 2, 5, 5], [1, 2, 3, 6, 7])  # overlapping chain and a repeated source
    want = before.copy()
    want[[1, 2, 3, 6, 7]] = before[[0, 1, 2, 5, 5]]
    assert np.array_equal(all_rows(pool), want)
    assert pool.fingerprints(list(range(8))) == content_fingerprints(want)


@pytest.mark.parametrize("geometry", [SMALL, ODD, BIG], ids=["small", "odd", "big"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fingerprints_equal_the_numpy_reference(case: tuple[str, str], geometry: Geometry) -> None:
    pool = pool_or_skip(*case, num_blocks=40, geometry=geometry)
    rows = random_rows(40, pool.block_bytes, seed=2)
    rows[0] = 0
    rows[1] = 0x80  # the extremes of the int8 view
    rows[2] = 0x7F
    pool.write_rows(list(range(40)), rows)
    assert pool.fingerprints(list(range(40))) == content_fingerprints(rows)
    assert pool.fingerprints([3, 3, 0]) == content_fingerprints(rows[[3, 3, 0]])


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_one_bit_flip_changes_the_fingerprint(case: tuple[str, str]) -> None:
    pool = pool_or_skip(*case, num_blocks=1 + 256 * 8, geometry=SMALL)
    base = random_rows(1, 256, seed=3)
    flips = np.repeat(base, 256 * 8, axis=0)
    bit = np.arange(256 * 8)
    flips[bit, bit // 8] ^= (1 << (bit % 8)).astype(np.uint8)
    rows = np.concatenate([base, flips])
    pool.write_rows(list(range(len(rows))), rows)
    got = pool.fingerprints(list(range(len(rows))))
    assert got == content_fingerprints(rows)
    assert got[0] not in set(got[1:])


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_a_one_bit_flip_in_any_row_of_a_large_block_shows(case: tuple[str, str]) -> None:
    pool = pool_or_skip(*case, num_blocks=1 + 8 * 16, geometry=BIG)
    base = random_rows(1, 32768, seed=4)
    rng = np.random.default_rng(5)
    words = np.concatenate([np.arange(0, 8192, 1024), np.arange(1023, 8192, 1024), rng.integers(0, 8192, 112)])
    flips = np.repeat(base, len(words), axis=0)
    byte = words * 4 + rng.integers(0, 4, len(words))
    flips[np.arange(len(words)), byte] ^= (1 << rng.integers(0, 8, len(words))).astype(np.uint8)
    rows = np.concatenate([base, flips])
    pool.write_rows(list(range(len(rows))), rows)
    got = pool.fingerprints(list(range(len(rows))))
    assert got == content_fingerprints(rows)
    assert got[0] not in set(got[1:])


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_copy_across_backends_through_numpy(case: tuple[str, str]) -> None:
    pool = pool_or_skip(*case, num_blocks=12, geometry=BIG)
    ref = make_pool("numpy", "cpu", 12, *BIG)
    ref.fill(list(range(12)), list(range(12)))
    ref.copy_to(pool, [0, 1, 2, 3], [11, 10, 9, 8])
    assert pool.fingerprints([11, 10, 9, 8]) == ref.fingerprints([0, 1, 2, 3])
    back = make_pool("numpy", "cpu", 12, *BIG)
    pool.copy_to(back, [8, 9], [0, 1])
    assert np.array_equal(back.read_rows([0, 1]), ref.read_rows([3, 2]))


@pytest.mark.parametrize("case", TIERS, ids=_ids)
def test_swap_out_and_in_between_tiers(case: tuple[str, str]) -> None:
    fast = pool_or_skip(*case, num_blocks=32, geometry=BIG)
    slow = pool_or_skip(case[0], "cpu", num_blocks=16, geometry=BIG) if case[0] != "cupy" else \
        make_pool("cupy", "cpu", 16, *BIG)
    fast.fill(list(range(32)), [1000 + i for i in range(32)])
    out_src, out_dst = [31, 4, 17, 0, 9], [2, 15, 0, 7, 3]
    fast.copy_to(slow, out_src, out_dst)  # swap out
    assert slow.fingerprints(out_dst) == seed_fingerprints([1000 + i for i in out_src], fast.block_bytes)
    assert np.array_equal(slow.read_rows(out_dst), fast.read_rows(out_src))
    fast.copy_to(slow, list(range(16)), list(range(15, -1, -1)))  # a whole-pool batch
    slow.copy_to(fast, [15, 14, 0], [20, 21, 22])  # swap in
    assert fast.fingerprints([20, 21, 22]) == seed_fingerprints([1000, 1001, 1015], fast.block_bytes)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_audit_finds_exactly_the_corrupted_blocks(case: tuple[str, str]) -> None:
    n = 600  # more than one fingerprinting step on the CPU backends
    pool = pool_or_skip(*case, num_blocks=n, geometry=BIG)
    seeds = [7 * i + 1 for i in range(n)]
    pool.fill(list(range(n)), seeds)
    fps = seed_fingerprints(seeds, pool.block_bytes)
    expected = {b: fps[b] for b in range(n) if b % 5}  # blocks 0, 5, 10, ... are not compared
    assert pool.audit(expected) == []
    pool.copy([3], [4])  # a stale copy
    row = pool.read_rows([599])
    row[0, 32767] ^= 0x80  # one bit, last byte of the pool
    pool.write_rows([599], row)
    pool.fill([261, 10], [5, 5])  # 10 is not compared
    assert pool.audit(expected) == [4, 261, 599]
    table = FingerprintTable(n)
    table.set_many(list(expected), list(expected.values()))
    assert pool.audit(table) == [4, 261, 599]
    assert pool.audit({}) == []


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bad_input_raises_and_changes_nothing(case: tuple[str, str]) -> None:
    pool = pool_or_skip(*case, num_blocks=4)
    pool.fill([0, 1, 2, 3], [1, 2, 3, 4])
    before = all_rows(pool)
    other = make_pool("numpy", "cpu", 4, *SMALL)
    bad_calls: list[tuple[type[Exception], Callable[[], object]]] = [
        (BlockOutOfRange, lambda: pool.copy([0], [4])),
        (BlockOutOfRange, lambda: pool.copy([-1], [0])),
        (DuplicateBlock, lambda: pool.copy([0, 1], [2, 2])),
        (BatchMismatch, lambda: pool.copy([0, 1], [2])),
        (BatchMismatch, lambda: pool.fill([0], [1, 2])),
        (PayloadSizeError, lambda: pool.write([0, 1], [bytes(pool.block_bytes), b"short"])),
        (PayloadSizeError, lambda: pool.write_rows([0], np.zeros((1, 3), np.uint8))),
        (PoolMismatch, lambda: pool.copy_to(other, [0], [0])),
        (BlockOutOfRange, lambda: pool.audit({9: 0})),
        (BadFingerprint, lambda: pool.audit({0: 2**64})),
        (BlockOutOfRange, lambda: pool.read(4)),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()
    assert np.array_equal(all_rows(pool), before)


# ---------------------------------------------------------------- GPU backends


@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_cuda_pool_swaps_and_audits_like_numpy(backend: str) -> None:
    if _CHOSEN and backend != _CHOSEN:
        pytest.skip(f"KV_BACKEND={_CHOSEN}")
    pytest.importorskip(backend, reason=f"{backend} is not installed (pip install 'kvoracle[{backend}]')")
    try:
        gpu = make_pool(backend, "cuda", 64, *BIG)
    except DeviceUnavailable as exc:
        pytest.skip(f"no CUDA device: {exc}")
    cpu = make_pool(backend, "cpu", 64, *BIG)
    seeds = list(range(64))
    gpu.fill(seeds, seeds)
    gpu.copy_to(cpu, seeds, seeds[::-1])
    gpu.copy([0, 1], [1, 0])
    cpu.copy_to(gpu, [63, 62], [0, 1])
    want = seed_fingerprints(seeds, gpu.block_bytes)
    assert gpu.fingerprints(seeds) == want
    assert cpu.fingerprints(seeds) == want[::-1]
    gpu.fill([40], [0])
    assert gpu.audit(dict(enumerate(want))) == [40]


# ---------------------------------------------------------------- selection and tables


def test_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KV_BACKEND", raising=False)
    assert default_backend() == "numpy"
    monkeypatch.setenv("KV_BACKEND", " Paddle ")
    assert default_backend() == "paddle"
    monkeypatch.setenv("KV_BACKEND", "tensorflow")
    with pytest.raises(UnknownBackend):
        default_backend()
    with pytest.raises(UnknownBackend):
        make_pool("jax", "cpu", 1, *SMALL)
    with pytest.raises(UnknownDevice):
        make_pool("numpy", "tpu", 1, *SMALL)
    with pytest.raises(DeviceUnavailable):
        make_pool("numpy", "cuda", 1, *SMALL)


@pytest.mark.parametrize(("backend", "package"), [("torch", "torch"), ("cupy", "cupy-cuda12x")])
def test_a_missing_backend_names_its_package(
    monkeypatch: pytest.MonkeyPatch, backend: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # makes `import backend` fail
    with pytest.raises(BackendUnavailable, match=package):
        make_pool(backend, "cuda", 1, *SMALL)


def test_fingerprint_table_is_a_mapping() -> None:
    t = FingerprintTable(4)
    t[2] = 2**64 - 1
    t.set_many([0, 2], [5, 6])
    assert dict(t) == {0: 5, 2: 6} and len(t) == 2
    del t[0]
    assert list(t) == [2] and 0 not in t
    with pytest.raises(KeyError):
        t[1]
    with pytest.raises(BlockOutOfRange):
        t[4] = 1
    with pytest.raises(BadFingerprint):
        t[1] = -1
