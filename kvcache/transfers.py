"""In-flight copies between tiers. Completion is a separate call, so any interleaving can be tested."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoracle.kvcache.tree import Node
from kvoracle.spec.types import BlockHash, CpuBlock, GpuBlock, RequestId, TransferId


@dataclass
class SwapOutJob:
    id: TransferId
    items: list[tuple[Node, GpuBlock, CpuBlock]]


@dataclass
class SwapInJob:
    id: TransferId
    request: RequestId | None  # None once the request is gone: failed blocks are then freed
    items: list[tuple[Node, CpuBlock, GpuBlock]]


@dataclass
class WriteJob:
    id: TransferId
    items: list[tuple[BlockHash, GpuBlock]]
    readers: list[Node | None]  # the node owning each source block (None: a private block)
    adopted: list[GpuBlock] = field(default_factory=list)  # released private blocks it frees when done


@dataclass
class PrefetchJob:
    id: TransferId
    request: RequestId | None
    items: list[tuple[BlockHash, GpuBlock]]


Job = SwapOutJob | SwapInJob | WriteJob | PrefetchJob
