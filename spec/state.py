"""VARIABLES and Init: the state of the cache layer (CacheState) and of the whole
system a scheduler runs on it (System).

Maps are plain dicts inside frozen dataclasses and are never mutated: every action
builds new ones. Ownership is not stored but derived (spec.view builds each block's
claims from the structures that hold it), so a broken implementation state (a block
claimed twice, or by nobody) is representable and INV-CONSERVE can say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
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

# --- the cache layer ---------------------------------------------------------------


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
class Heap:
    """One tier's LRU heap, as eviction sees it (lazy deletion): the nodes it holds an
    entry for, and the nodes whose in_heap flag says they have one. An entry may be
    stale (its node no longer evictable); eviction then drops it and clears the flag."""

    entries: frozenset[BlockHash] = frozenset()
    flagged: frozenset[BlockHash] = frozenset()


NO_HEAP = Heap()


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
    gpu_heap: Heap = NO_HEAP
    cpu_heap: Heap = NO_HEAP


def initial(gpu_size: int, cpu_size: int) -> CacheState:
    """Init of the cache layer: every block free, nothing cached, nothing in flight."""
    return CacheState(
        gpu_size=gpu_size,
        cpu_size=cpu_size,
        gpu_free=tuple(GpuBlock(g) for g in range(gpu_size)),
        cpu_free=tuple(CpuBlock(c) for c in range(cpu_size)),
    )


# --- the system: requests and time on top of the cache -------------------------------


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue after a preemption
    FINISHED = "finished"
    ABORTED = "aborted"

    def __repr__(self) -> str:  # evaluable, as the rest of a printed state
        return f"Status.{self.name}"


QUEUED = (Status.WAITING, Status.PREEMPTED)
EXITED = (Status.FINISHED, Status.ABORTED)


@dataclass(frozen=True)
class Request:
    status: Status
    tokens: tuple[int, ...]  # the prompt, then the tokens decoded so far
    computed: int = 0  # tokens whose KV is computed (or being filled by a swap-in or prefetch)
    admissions: int = 0  # times admitted so far (re-admission follows a preemption)


@dataclass(frozen=True)
class System:
    cache: CacheState
    requests: Mapping[RequestId, Request]
    block_size: int
    timeout: int  # ticks after which an unanswered transfer has been timed out (LIVE-TRANSFER)
    now: int = 0
    started: Mapping[TransferId, int] = field(default_factory=dict)  # tick each in-flight transfer began


def initial_system(gpu_size: int, cpu_size: int, block_size: int, timeout: int) -> System:
    """Init of the system: the initial cache, no request, time 0."""
    return System(initial(gpu_size, cpu_size), {}, block_size, timeout)


# --- derived views used by actions and properties -------------------------------------


def children(s: CacheState, h: BlockHash | None) -> list[BlockHash]:
    return [k for k, n in s.nodes.items() if n.parent == h]


def gpu_evictable(s: CacheState, h: BlockHash) -> bool:
    """On GPU, refcount 0, no child on the GPU side, not pinned."""
    return not gpu_unevictable(s, h)


def gpu_unevictable(s: CacheState, h: BlockHash) -> str:
    """Why node h is not evictable on the GPU (gpu_evictable's definition); '' when it is."""
    n = s.nodes[h]
    if not isinstance(n.tier, OnGpu):
        return f"it is {type(n.tier).__name__}, not OnGpu"
    if n.refcount != 0:
        return f"its refcount is {n.refcount}"
    if s.gpu_pins.get(n.tier.gpu, 0):
        return f"a transfer reads its GPU block {n.tier.gpu}"
    child = next((c for c in children(s, h) if gpu_side(s.nodes[c].tier)), None)
    return "" if child is None else f"its child {child:#x} is on the GPU side"


def cpu_evictable(s: CacheState, h: BlockHash) -> bool:
    """On CPU, no children, not pinned."""
    return not cpu_unevictable(s, h)


def cpu_unevictable(s: CacheState, h: BlockHash) -> str:
    """Why node h is not evictable on the CPU (cpu_evictable's definition); '' when it is."""
    n = s.nodes[h]
    if not isinstance(n.tier, OnCpu):
        return f"it is {type(n.tier).__name__}, not OnCpu"
    if s.cpu_pins.get(n.tier.cpu, 0):
        return f"a transfer reads its CPU block {n.tier.cpu}"
    child = next(iter(children(s, h)), None)
    return "" if child is None else f"it has a child, {child:#x}"


def evictable_nodes(s: CacheState) -> tuple[list[BlockHash], list[BlockHash]]:
    """The nodes gpu_evictable and cpu_evictable hold for, from one look at each node's parent (not a
    search for children per node)."""
    nodes = s.nodes
    parents: set[BlockHash | None] = set()
    gpu_parents: set[BlockHash | None] = set()  # of a child on the GPU side
    for n in nodes.values():
        parents.add(n.parent)
        if gpu_side(n.tier):
            gpu_parents.add(n.parent)
    gpu, cpu = [], []
    for h, n in nodes.items():
        t = n.tier
        if isinstance(t, OnGpu) and n.refcount == 0 and not s.gpu_pins.get(t.gpu) and h not in gpu_parents:
            gpu.append(h)
        elif isinstance(t, OnCpu) and not s.cpu_pins.get(t.cpu) and h not in parents:
            cpu.append(h)
    return gpu, cpu


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks a table needs to hold `tokens` tokens."""
    return -(-tokens // block_size)


def due(started_at: int, now: int, timeout: int) -> bool:
    """Whether a transfer that started at `started_at` has been in flight its `timeout`
    ticks at `now`: the tick that brings it there ends it (Next times it out then, no
    sooner; LIVE-TRANSFER finds it still in flight after)."""
    return now - started_at >= timeout
