"""Argument checks and lazy backend imports shared by every pool.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Final

import numpy as np

from kvoracle.kvcache.errors import BlockOutOfRange

if TYPE_CHECKING:  # paddle ships types; importing it costs a second, so only the checker does
    pass
from kvoracle.kvcache.pool.errors import (
    BackendUnavailable,
    DuplicateBlock,
    GeometryError,
    PoolMismatch,
    UnknownDevice,
)
from kvoracle.kvcache.pool.protocol import Blocks, Ids

_ITEMSIZE: Final[dict[str, int]] = {"float16": 2, "float32": 4}


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
