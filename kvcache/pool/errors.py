"""Errors of the block pools: bad input (PoolError) and missing backends or devices.
"""

from __future__ import annotations

from typing import Final

from kvoracle.kvcache.errors import KVCacheError
from kvoracle.kvcache.pool.protocol import BACKENDS

_INSTALL: Final[dict[str, str]] = {
    "numpy": "pip install numpy (kvoracle's runtime needs it)",
    "paddle": "pip install 'kvoracle[paddle]' (paddlepaddle; paddlepaddle-gpu for a GPU)",
    "torch": "pip install 'kvoracle[torch]' (torch)",
    "cupy": "pip install 'kvoracle[cupy]' (cupy-cuda12x)",
}


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
