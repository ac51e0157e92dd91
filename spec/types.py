"""Identifiers, owners, node tier states and transfer outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NewType

GpuBlock = NewType("GpuBlock", int)
CpuBlock = NewType("CpuBlock", int)
BlockHash = NewType("BlockHash", int)
RequestId = NewType("RequestId", int)
TransferId = NewType("TransferId", int)


class Tier(Enum):
    GPU = "gpu"
    CPU = "cpu"


# --- who owns a block (exactly one at every instant: INV-CONSERVE) -------------


@dataclass(frozen=True)
class Free:
    pass


@dataclass(frozen=True)
class OwnedByRequest:
    request: RequestId


@dataclass(frozen=True)
class OwnedByNode:
    node: BlockHash


@dataclass(frozen=True)
class InFlight:
    transfer: TransferId


Owner = Free | OwnedByRequest | OwnedByNode | InFlight


# --- where a prefix-tree node's data lives -------------------------------------


@dataclass(frozen=True)
class OnGpu:
    gpu: GpuBlock


@dataclass(frozen=True)
class SwappingOut:
    """Copy GPU -> CPU in flight: the node still owns `gpu` (pinned); `cpu` is InFlight."""

    gpu: GpuBlock
    cpu: CpuBlock


@dataclass(frozen=True)
class OnCpu:
    cpu: CpuBlock


@dataclass(frozen=True)
class SwappingIn:
    """Copy CPU -> GPU in flight: the node still owns `cpu` (pinned); `gpu` is InFlight."""

    cpu: CpuBlock
    gpu: GpuBlock


TierState = OnGpu | SwappingOut | OnCpu | SwappingIn


def gpu_side(tier: TierState) -> bool:
    """True when the node counts as on the GPU for its parent (it holds or fills a GPU block)."""
    return not isinstance(tier, OnCpu)


def gpu_block_of(tier: TierState) -> GpuBlock | None:
    """The GPU block a request's table lists for this node, if any."""
    if isinstance(tier, OnGpu | SwappingOut | SwappingIn):
        return tier.gpu
    return None


# --- how a transfer ends ---------------------------------------------------------


@dataclass(frozen=True)
class Ok:
    pass


@dataclass(frozen=True)
class Error:
    pass


@dataclass(frozen=True)
class Partial:
    """The first `done` items succeeded, the rest failed."""

    done: int


@dataclass(frozen=True)
class Timeout:
    pass


Outcome = Ok | Error | Partial | Timeout


def succeeded(outcome: Outcome, items: int) -> int:
    """How many leading items of a transfer the outcome completed."""
    if isinstance(outcome, Ok):
        return items
    if isinstance(outcome, Partial):
        return outcome.done
    return 0


def describe(outcome: Outcome) -> str:
    if isinstance(outcome, Partial):
        return f"partial({outcome.done})"
    return type(outcome).__name__.lower()
