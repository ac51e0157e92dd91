"""The abstract state of the cache layer.

Maps are plain dicts inside frozen dataclasses and are never mutated: every action
builds new ones. Ownership is not stored but derived (see `invariants.claims`), so a
broken implementation state (a block claimed twice, or by nobody) is representable
and INV-CONSERVE can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    GpuBlock,
    OnCpu,
    OnGpu,
    RequestId,
    TierState,
    TransferId,
    gpu_side,
)


@dataclass(frozen=True)
class Node:
    """A prefix-tree node: one full block named by its chained hash."""

    parent: BlockHash | None
    tier: TierState
    refcount: int


@dataclass(frozen=True)
class Holding:
    """What a live request holds: its matched tree path, then its private blocks.

    Its block table is the GPU block of each path node followed by `private`.
    """

    path: tuple[BlockHash, ...]
    private: tuple[GpuBlock, ...]


@dataclass(frozen=True)
class SwapOut:
    items: tuple[tuple[BlockHash, GpuBlock, CpuBlock], ...]


@dataclass(frozen=True)
class SwapIn:
    """Fills `gpu` from `cpu` for each node; `request` is None once the request is gone."""

    request: RequestId | None
    items: tuple[tuple[BlockHash, CpuBlock, GpuBlock], ...]


@dataclass(frozen=True)
class StorageWrite:
    """Reads GPU blocks into storage; `adopted` are released private blocks it frees when done."""

    items: tuple[tuple[BlockHash, GpuBlock], ...]
    adopted: tuple[GpuBlock, ...] = ()


@dataclass(frozen=True)
class Prefetch:
    """Fills GPU blocks from storage; they join the request's private blocks."""

    request: RequestId | None
    items: tuple[tuple[BlockHash, GpuBlock], ...]


Transfer = SwapOut | SwapIn | StorageWrite | Prefetch


@dataclass(frozen=True)
class CacheState:
    gpu_size: int
    cpu_size: int
    gpu_free: tuple[GpuBlock, ...]  # sorted; duplicates are kept so INV-CONSERVE sees them
    cpu_free: tuple[CpuBlock, ...]
    nodes: Mapping[BlockHash, Node] = field(default_factory=dict)
    requests: Mapping[RequestId, Holding] = field(default_factory=dict)
    transfers: Mapping[TransferId, Transfer] = field(default_factory=dict)
    stored: frozenset[BlockHash] = frozenset()
    gpu_pins: Mapping[GpuBlock, int] = field(default_factory=dict)  # only non-zero counts
    cpu_pins: Mapping[CpuBlock, int] = field(default_factory=dict)
    next_transfer: int = 0


@dataclass(frozen=True)
class Counters:
    """The counters an implementation reports (INV-COUNTERS compares them with the state)."""

    gpu_free: int
    cpu_free: int
    gpu_evictable: int
    cpu_evictable: int
    gpu_in_use: int


@dataclass(frozen=True)
class Observed:
    """What an implementation exposes beyond the state: its heaps' reach and its counters.

    `*_findable` are the nodes eviction can reach (entries of the LRU heaps). They are
    policy, so refinement does not compare them; the two heap invariants constrain them.
    """

    gpu_findable: frozenset[BlockHash]
    cpu_findable: frozenset[BlockHash]
    counters: Counters


def initial(gpu_size: int, cpu_size: int) -> CacheState:
    return CacheState(
        gpu_size=gpu_size,
        cpu_size=cpu_size,
        gpu_free=tuple(GpuBlock(g) for g in range(gpu_size)),
        cpu_free=tuple(CpuBlock(c) for c in range(cpu_size)),
    )


# --- derived views used by actions and invariants --------------------------------


def children(s: CacheState, h: BlockHash | None) -> list[BlockHash]:
    return [k for k, n in s.nodes.items() if n.parent == h]


def gpu_evictable(s: CacheState, h: BlockHash) -> bool:
    """On GPU, refcount 0, no child on the GPU side, not pinned."""
    n = s.nodes[h]
    if not isinstance(n.tier, OnGpu) or n.refcount != 0:
        return False
    if s.gpu_pins.get(n.tier.gpu, 0):
        return False
    return not any(gpu_side(s.nodes[c].tier) for c in children(s, h))


def cpu_evictable(s: CacheState, h: BlockHash) -> bool:
    """On CPU, no children, not pinned."""
    n = s.nodes[h]
    if not isinstance(n.tier, OnCpu) or s.cpu_pins.get(n.tier.cpu, 0):
        return False
    return not children(s, h)


def true_counters(s: CacheState) -> Counters:
    return Counters(
        gpu_free=len(s.gpu_free),
        cpu_free=len(s.cpu_free),
        gpu_evictable=sum(1 for h in s.nodes if gpu_evictable(s, h)),
        cpu_evictable=sum(1 for h in s.nodes if cpu_evictable(s, h)),
        gpu_in_use=s.gpu_size - len(s.gpu_free),
    )
