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

One module per backend (numpy_pool, paddle_pool, torch_pool, cupy_pool); the
fingerprint definition in fingerprint.py.
"""

from __future__ import annotations

import os

from kvoracle.kvcache.pool.cupy_pool import CupyPool, _CupyHostPool
from kvoracle.kvcache.pool.errors import (
    BackendUnavailable,
    BadFingerprint,
    BatchMismatch,
    DeviceUnavailable,
    DuplicateBlock,
    GeometryError,
    PayloadSizeError,
    PoolError,
    PoolMismatch,
    UnknownBackend,
    UnknownDevice,
)
from kvoracle.kvcache.pool.fingerprint import (
    FingerprintTable,
    content_fingerprints,
    seed_content,
    seed_fingerprints,
)
from kvoracle.kvcache.pool.numpy_pool import NumpyPool
from kvoracle.kvcache.pool.paddle_pool import PaddlePool, _load_paddle
from kvoracle.kvcache.pool.protocol import (
    BACKENDS,
    BlockPool,
    Blocks,
    Bytes2D,
    PoolDType,
)
from kvoracle.kvcache.pool.torch_pool import TorchPool
from kvoracle.kvcache.pool.validation import _load, _normalize_device

__all__ = [
    "BACKENDS", "BackendUnavailable", "BadFingerprint", "BatchMismatch", "BlockPool", "Blocks",
    "Bytes2D", "CupyPool", "DeviceUnavailable", "DuplicateBlock", "FingerprintTable",
    "GeometryError", "NumpyPool", "PaddlePool", "PayloadSizeError", "PoolDType", "PoolError",
    "PoolMismatch", "TorchPool", "UnknownBackend", "UnknownDevice", "content_fingerprints",
    "default_backend", "default_device", "make_pool", "seed_content", "seed_fingerprints",
]


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
