"""The tiered-cache adapter Protocol: an engine's prefix cache with a CPU tier, swaps,
storage writes and prefetches, driven call by call, with the outcome of every transfer
chosen by the machine (oracle.cache_machine).

Each operation returns the choices the engine made (which blocks, which evictions,
which writes) in spec/ terms, so that the machine can apply the same spec/ action to
the engine's abstraction and compare: `abstract` is the refinement hook. An engine that
cannot map its state to spec/ (for one, an engine that keeps a host copy of a block
while it is on the GPU: spec/'s tiers are exclusive) returns None there; the machine
then checks what `observe` and `invariants` allow.

Requests are spec/ RequestIds; the observations key tables by "r<id>". Both
observations must give `free`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kvoracle.oracle.engine import BadInput, Observation
from kvoracle.spec.actions import Allocate, CacheEvent, Commit, Complete, Evict, EvictStep, Match, Release, Reset
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import BlockHash, GpuBlock, Outcome, RequestId, TransferId


@dataclass(frozen=True)
class Matched:
    """What a match started: GPU blocks that a swap-in and a storage prefetch will fill."""

    swap_dests: tuple[GpuBlock, ...] = ()
    prefetch_dests: tuple[GpuBlock, ...] = ()


@dataclass(frozen=True)
class Blocks:
    """A request's tokens, and spec/'s chained hash of each full block of them (an engine
    keyed by tokens uses the first, one keyed by hashes the second)."""

    tokens: tuple[int, ...]
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True)
class Pending:
    """A transfer in flight."""

    transfer: TransferId
    items: int  # blocks it moves (a partial outcome completes a prefix of them)


class TieredAdapter(Protocol):
    name: str
    block_size: int
    gpu_blocks: int
    cpu_blocks: int
    # The bad calls it can make, each with the exception the engine must refuse it with.
    refusals: Mapping[BadInput, type[Exception]]
    # Optional: `transfer_outcomes: frozenset[str]`, the outcomes the engine's transfers can
    # have ("ok", "error", "timeout", "partial"; a synchronous swap: {"ok"}); the machine draws
    # only those. Absent: every outcome. And `match_limits: bool`: False for an engine that
    # picks its own swap and prefetch budget (the machine then always passes `limit` = the
    # blocks the request lacks). Absent: True, the machine draws limits below that too, and
    # above the free blocks (then it also matches a prompt that does not fit, and releases it).

    # --- what a scheduler asks before it calls ------------------------------------------
    def free_gpu(self) -> int: ...
    def gpu_hits(self, prompt: Blocks) -> int:
        """Leading blocks of `prompt` cached on the GPU."""
        ...
    def ready(self, r: RequestId) -> bool:
        """Nothing is still filling the request's blocks (its swap-in and prefetch ended)."""
        ...
    def table(self, r: RequestId) -> tuple[GpuBlock, ...]: ...
    def in_flight(self) -> list[Pending]: ...
    def cached(self) -> int:
        """Blocks the prefix cache indexes, on either tier."""
        ...

    # --- operations -------------------------------------------------------------------
    def match(self, r: RequestId, prompt: Blocks, limit: int) -> Matched:
        """Take the cached prefix of `prompt` for a new request `r`, starting a swap-in or
        prefetch of at most `limit` blocks for what is on the CPU or in storage."""
        ...
    def allocate(self, r: RequestId, n: int) -> tuple[GpuBlock, ...]: ...
    def commit(self, r: RequestId, full: Blocks) -> None:
        """Index the request's leading full blocks (`full`) in the prefix cache."""
        ...
    def release(self, r: RequestId, write: Blocks) -> tuple[tuple[BlockHash, GpuBlock], ...]:
        """End the request, first starting a storage write of its leading blocks in
        `write` (none when empty); the writes it started."""
        ...
    def evict_gpu(self, n: int) -> tuple[EvictStep, ...]: ...
    def evict_cpu(self, n: int) -> tuple[EvictStep, ...]: ...
    def complete(self, t: TransferId, outcome: Outcome) -> None: ...
    def reset(self) -> None:
        """Drop the whole cache (allowed only when no request is live)."""
        ...
    def bad_call(self, kind: BadInput, r: RequestId | None) -> bool:
        """Make the bad call: about `r`, a request that ended for DOUBLE_FINISH and a live
        one otherwise (None: there is none). False: not applicable now, nothing was
        called. The engine's exception propagates."""
        ...

    # --- what the machine checks -----------------------------------------------------
    def observe(self) -> Observation:
        """The GPU tier, in block ids; `pinned` lists blocks in-flight transfers hold."""
        ...
    def observe_cpu(self) -> Observation:
        """The CPU tier: no tables (requests hold GPU blocks only)."""
        ...
    def snapshot(self) -> object:
        """Everything comparable, for "a refused call changed nothing" (equality only)."""
        ...
    def abstract(self) -> CacheState | None: ...
    def invariants(self) -> list[Violation]:
        """The engine's own structural checks (links, heaps, kept counters)."""
        ...


@dataclass(frozen=True)
class Call:
    """One operation of the Protocol with its arguments: the machine makes it, and a
    reproduction writes it out (`source`) and makes it again on the engine as it is."""

    method: str  # a name of the operations above
    args: tuple[object, ...] = ()
    limit: int | None = None  # match's keyword

    def run(self, adapter: TieredAdapter) -> object:
        operation = getattr(adapter, self.method)
        return operation(*self.args) if self.limit is None else operation(*self.args, limit=self.limit)

    def source(self, adapter: str) -> str:
        """The call as Python text on the adapter named `adapter` (the arguments' reprs are
        their constructors: Blocks, Ok(), ...)."""
        args = [repr(a) for a in self.args] + ([] if self.limit is None else [f"limit={self.limit!r}"])
        return f"{adapter}.{self.method}({', '.join(args)})"


def action_of(call: Call, result: object) -> CacheEvent:
    """The spec action an operation names, with the choices its result reports: the one
    definition the machine's record and a reproduction's check both apply."""
    m, a = call.method, call.args
    listed = tuple(result) if isinstance(result, (tuple, list)) else None
    if m == "match" and isinstance(result, Matched) and isinstance(a[1], Blocks):
        return Match(RequestId(_int(a[0])), a[1].hashes, result.swap_dests, result.prefetch_dests, call.limit)
    if m == "allocate" and listed is not None:
        return Allocate(RequestId(_int(a[0])), listed, _int(a[1]))
    if m == "commit" and isinstance(a[1], Blocks):
        return Commit(RequestId(_int(a[0])), a[1].hashes)
    if m == "release" and listed is not None:
        return Release(RequestId(_int(a[0])), listed)
    if m in ("evict_gpu", "evict_cpu") and listed is not None:
        return Evict(listed)
    if m == "complete" and isinstance(a[1], Outcome):
        return Complete(TransferId(_int(a[0])), a[1])
    if m == "reset":
        return Reset()
    raise TypeError(f"no spec action for {call.method}{call.args!r} returning {result!r}")


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{value!r} is no id")
    return value
