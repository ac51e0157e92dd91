"""GPU checks of the KV block pool: the backend tests on torch and cupy, then bandwidth figures.

On a CUDA machine it runs tests/test_pool.py with KV_BACKEND=torch and KV_BACKEND=cupy,
then prints, for each backend, every figure beside the hardware reference it is judged
against, and the ratio:

  - pinned host->device and device->host copy of one large buffer (the PCIe reference);
  - swap-out and swap-in GB/s for batches of 1, 64 and 4,096 blocks
    (GPU pool <-> pinned CPU pool, BlockPool.copy_to);
  - a plain float32 reduction on the device (the HBM reference: the fastest reduction
    of the backends measured so far, since cupy's own reads HBM slower than torch's);
  - the whole-pool audit over a pool of --audit-gb GB (40 by default; smaller, and
    said so, when the device has less free memory), and the fingerprint path it took.

The largest swap batch and the audit also print issue 17's targets (swap 50 GB/s,
audit 3.4 TB/s) and whether they are met. docs/gpu.md has the figures of an H200.

Without a CUDA device it says so and exits 0. A benchmark: nothing is asserted about
speed; the exit status is 1 only when a backend's tests fail.

    python bench/gpu_check.py [--audit-gb 40] [--backends torch,cupy] [--skip-tests]
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvoracle.kvcache.pool import (  # noqa: E402
    BlockPool, CupyPool, FingerprintTable, TorchPool, make_pool, seed_fingerprints,
)

ROOT = Path(__file__).resolve().parent.parent
GEOMETRY = (16, 8, 128)  # block_size, heads, head_dim: fp16 blocks of 32 KiB
GIB = 1 << 30
DEVICE = "cuda"  # where the fast pools go (a module constant, so a dry run can point it elsewhere)
SWAP_GPU_BLOCKS = 16384  # 512 MiB
SWAP_CPU_BLOCKS = 8192  # 256 MiB pinned
SWAP_BATCHES = ((1, 300), (64, 60), (4096, 6))  # (blocks per call, calls per timing)
SWAP_TARGET = 50.0  # GB/s for the largest batch (issue 17; PCIe on an H200: about 55 each way)
AUDIT_TARGET = 3400.0  # GB/s (issue 17; HBM on an H200: about 4,200-4,400)


def best_seconds(work: Callable[[], None], repeat: int = 3) -> float:
    """Fastest of `repeat` timed runs after one warm-up run (work must synchronise itself)."""
    work()
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


class Device(Protocol):
    """What the figures need from a CUDA library beyond the pool itself."""

    name: str

    def copy_refs(self, nbytes: int) -> tuple[float, float]:
        """(host->device, device->host) seconds for one pinned copy of nbytes."""
        ...

    def reduction(self, nbytes: int) -> float:
        """Seconds for a float32 sum over nbytes on the device."""
        ...

    def free_bytes(self) -> int: ...

    def release(self) -> None:
        """Hand cached device and pinned memory back, so the next allocation finds it."""
        ...


class TorchDevice:
    def __init__(self, torch: ModuleType) -> None:
        self.t = torch
        self.name = f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"

    def _sync(self) -> None:
        self.t.cuda.synchronize()

    def copy_refs(self, nbytes: int) -> tuple[float, float]:
        t = self.t
        host = t.empty(nbytes, dtype=t.uint8, pin_memory=True)
        dev = t.empty(nbytes, dtype=t.uint8, device="cuda")

        def h2d() -> None:
            dev.copy_(host, non_blocking=True)
            self._sync()

        def d2h() -> None:
            host.copy_(dev, non_blocking=True)
            self._sync()

        return best_seconds(h2d), best_seconds(d2h)

    def reduction(self, nbytes: int) -> float:
        x = self.t.empty(nbytes // 4, dtype=self.t.float32, device="cuda")

        def total() -> None:
            x.sum()
            self._sync()

        return best_seconds(total)

    def free_bytes(self) -> int:
        return int(self.t.cuda.mem_get_info()[0])

    def release(self) -> None:
        self.t.cuda.empty_cache()


class CupyDevice:
    def __init__(self, cupy: ModuleType) -> None:
        self.cp = cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        self.name = f"cupy {cupy.__version__} on {props['name'].decode()}"

    def _sync(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def copy_refs(self, nbytes: int) -> tuple[float, float]:
        cp = self.cp
        host = np.frombuffer(cp.cuda.alloc_pinned_memory(nbytes), dtype=np.uint8, count=nbytes)
        dev = cp.empty(nbytes, dtype=cp.uint8)

        def h2d() -> None:
            dev.set(host)
            self._sync()

        def d2h() -> None:
            dev.get(out=host)
            self._sync()

        return best_seconds(h2d), best_seconds(d2h)

    def reduction(self, nbytes: int) -> float:
        x = self.cp.empty(nbytes // 4, dtype=self.cp.float32)

        def total() -> None:
            x.sum()
            self._sync()

        return best_seconds(total)

    def free_bytes(self) -> int:
        return int(self.cp.cuda.runtime.memGetInfo()[0])

    def release(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()
        self.cp.get_default_pinned_memory_pool().free_all_blocks()


def find_device(backend: str) -> tuple[Device | None, str]:
    """The backend's CUDA device, or None and why not."""
    try:
        module = importlib.import_module(backend)
    except ImportError as exc:
        return None, f"{backend} is not installed ({exc})"
    if backend == "torch":
        if not module.cuda.is_available():
            return None, "torch sees no CUDA device"
        return TorchDevice(module), ""
    try:
        count = int(module.cuda.runtime.getDeviceCount())
    except module.cuda.runtime.CUDARuntimeError as exc:
        return None, f"cupy sees no CUDA device ({exc})"
    return (CupyDevice(module), "") if count else (None, "cupy sees no CUDA device")


def run_tests(backend: str) -> bool:
    env = {**os.environ, "KV_BACKEND": backend}
    # --noconftest and an empty filterwarnings: this file needs neither Hypothesis nor its
    # profiles, and a GPU machine may lack Hypothesis.
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--noconftest",
           "-o", "filterwarnings=", "tests/test_pool.py"]
    print(f"$ KV_BACKEND={backend} {' '.join(cmd[1:])}", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode == 0


Row = tuple[str, str, str]  # what, figure, how: a row of bench/summary.py's table


class Lines:
    """Prints each figure as it is measured, beside its reference, and keeps it as a row."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.rows: list[Row] = []

    def __call__(self, what: str, gbps: float, ref_name: str = "", ref_gbps: float = 0.0,
                 target: float = 0.0) -> None:
        ratio = f"{100 * gbps / ref_gbps:5.1f}% of {ref_name} ({ref_gbps:,.1f} GB/s)" if ref_gbps else ""
        goal = f"; target {target:,.0f}: {'met' if gbps >= target else 'short'}" if target else ""
        print(f"  {what:<48} {gbps:>9,.2f} GB/s   {ratio}{goal}", flush=True)
        self.rows.append((f"GPU, {self.backend}: {' '.join(what.split())}", f"{gbps:,.1f} GB/s", f"{ratio.strip()}{goal}"))


def swap_figures(line: Lines, backend: str, h2d: float, d2h: float) -> None:
    gpu = make_pool(backend, DEVICE, SWAP_GPU_BLOCKS, *GEOMETRY)
    cpu = make_pool(backend, "cpu", SWAP_CPU_BLOCKS, *GEOMETRY)
    gpu.fill(list(range(SWAP_CPU_BLOCKS)), list(range(SWAP_CPU_BLOCKS)))  # real content, not zeros
    if isinstance(cpu, TorchPool):  # without the alias, swaps fall back to copies through numpy
        print(f"  zero-copy swap path (kernels on pinned host memory): {cpu.cuda_alias(gpu.device) is not None}")
    rng = np.random.default_rng(0)
    for batch, calls in SWAP_BATCHES:
        srcs = [rng.choice(SWAP_GPU_BLOCKS, batch, replace=False) for _ in range(calls)]
        dsts = [rng.choice(SWAP_CPU_BLOCKS, batch, replace=False) for _ in range(calls)]
        moved = batch * calls * gpu.block_bytes / 1e9

        def out() -> None:
            for s, d in zip(srcs, dsts):
                gpu.copy_to(cpu, s, d)

        def back() -> None:
            for s, d in zip(srcs, dsts):
                cpu.copy_to(gpu, d, s)

        target = SWAP_TARGET if batch == SWAP_BATCHES[-1][0] else 0.0
        line(f"swap-out, {batch:>5} blocks per call", moved / best_seconds(out), "device->host copy", d2h, target)
        line(f"swap-in,  {batch:>5} blocks per call", moved / best_seconds(back), "host->device copy", h2d, target)
    src, dst = srcs[-1], dsts[-1]  # the last swap-in copied cpu[dst] -> gpu[src]
    same = cpu.fingerprints(dst) == gpu.fingerprints(src)
    print(f"  swapped blocks keep their fingerprints: {same}", flush=True)


def audit_pool(backend: str, want_bytes: float, free: int) -> tuple[BlockPool, FingerprintTable, int]:
    """A pool of want_bytes (less if memory is short), a few blocks filled, and its table."""
    block_bytes = GEOMETRY[0] * GEOMETRY[1] * GEOMETRY[2] * 2
    room = int(free * 0.9) - 2 * GIB  # leave room for the audit's temporaries
    size = int(min(want_bytes, room))
    if size < want_bytes:
        print(f"  (only {free / 1e9:.1f} GB free: audit pool cut to {size / 1e9:.1f} GB)", flush=True)
    n = size // block_bytes
    pool = make_pool(backend, DEVICE, n, *GEOMETRY)
    table = FingerprintTable(n)
    table.set_many(np.arange(n), np.zeros(n, dtype=np.uint64))  # an all-zero block fingerprints to 0
    filled = list(range(0, n, max(1, n // 64)))
    pool.fill(filled, filled)
    table.set_many(filled, seed_fingerprints(filled, block_bytes))
    return pool, table, n


def audit_figures(line: Lines, device: Device, backend: str, audit_gb: float, hbm: float) -> None:
    pool, table, n = audit_pool(backend, audit_gb * 1e9, device.free_bytes())
    if isinstance(pool, (TorchPool, CupyPool)):
        print(f"  fingerprint kernel: {pool.fingerprint_path}", flush=True)
    size = n * pool.block_bytes
    victim = n // 3
    pool.fill([victim], [0xBAD])
    found = pool.audit(table)
    print(f"  audit finds the one corrupted block: {found == [victim]} ({found[:4]})", flush=True)
    as_dict = dict(table.items())

    def audit_table() -> None:
        pool.audit(table)

    def audit_dict() -> None:
        pool.audit(as_dict)

    line(f"audit, {size / 1e9:.1f} GB pool, FingerprintTable", size / 1e9 / best_seconds(audit_table),
         "HBM reduction", hbm, AUDIT_TARGET)
    line(f"audit, same pool, dict of {n:,} entries", size / 1e9 / best_seconds(audit_dict, repeat=1),
         "HBM reduction", hbm)


def figures(backend: str, device: Device, audit_gb: float, hbm_so_far: float) -> tuple[float, list[Row]]:
    """Prints the backend's figures; returns the fastest HBM reduction measured so far
    (the reference every audit is judged against: a backend's own reduction may be slower)
    and the figures as rows."""
    line = Lines(backend)
    print(f"\n{device.name}", flush=True)
    h2d_s, d2h_s = device.copy_refs(GIB)
    h2d, d2h = GIB / h2d_s / 1e9, GIB / d2h_s / 1e9
    line("reference: pinned host->device copy, 1 GiB", h2d)
    line("reference: pinned device->host copy, 1 GiB", d2h)
    device.release()
    swap_figures(line, backend, h2d, d2h)
    device.release()
    reduce_bytes = min(8 * GIB, device.free_bytes() // 4)
    own = reduce_bytes / device.reduction(reduce_bytes) / 1e9
    line(f"reference: float32 reduction, {reduce_bytes / GIB:.1f} GiB (HBM)", own)
    hbm = max(own, hbm_so_far)
    device.release()
    audit_figures(line, device, backend, audit_gb, hbm)
    device.release()
    return hbm, line.rows


def _backends(text: str) -> list[str]:
    """--backends: the GPU backends named, each torch or cupy (numpy and paddle run in CI)."""
    named = [b.strip() for b in text.split(",") if b.strip()]
    wrong = [b for b in named if b not in ("torch", "cupy")]
    if wrong or not named:
        raise argparse.ArgumentTypeError(f"want torch, cupy or both, comma-separated, not {text!r}")
    return named


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--audit-gb", type=float, default=40.0, help="audit pool size in GB (default 40)")
    parser.add_argument("--backends", default="torch,cupy", type=_backends, help="comma-separated: torch, cupy")
    parser.add_argument("--skip-tests", action="store_true", help="figures only")
    args = parser.parse_args(argv)
    found: list[tuple[str, Device]] = []
    for backend in args.backends:
        device, why = find_device(backend)
        if device is None:
            print(f"{backend}: skipped: {why}")
        else:
            found.append((backend, device))
    if not found:
        print("no backend found a CUDA device (the reasons above): nothing to check here (the GPU tests skip; "
              "numpy and paddle run in CI)")
        return 0
    failed = [] if args.skip_tests else [b for b, _ in found if not run_tests(b)]
    hbm = 0.0
    for backend, device in found:
        hbm, _ = figures(backend, device, args.audit_gb, hbm)
    if failed:
        print(f"\nbackend tests FAILED on: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
