"""The request lifecycle on top of the cache layer: statuses, exits, and the
properties INV-REQUEST, LIVE-EXIT and LIVE-TRANSFER."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Mapping, Sequence

from kvoracle.spec import actions
from kvoracle.spec.actions import PreconditionError
from kvoracle.spec.invariants import Violation, gpu_claims
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import BlockHash, Free, GpuBlock, InFlight, OwnedByNode, OwnedByRequest, RequestId, TransferId


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue after a preemption
    FINISHED = "finished"
    ABORTED = "aborted"


QUEUED = (Status.WAITING, Status.PREEMPTED)
EXITED = (Status.FINISHED, Status.ABORTED)


@dataclass(frozen=True)
class SchedulerState:
    cache: CacheState
    status: Mapping[RequestId, Status]
    started: Mapping[TransferId, int]  # tick at which each in-flight transfer began
    now: int
    timeout: int


def exit_request(
    s: SchedulerState, r: RequestId, to: Status, writes: Sequence[tuple[BlockHash, GpuBlock]] = ()
) -> SchedulerState:
    """finish (to FINISHED), abort (to ABORTED) or preempt (to PREEMPTED): start the
    write, then release r's blocks whatever the write will do."""
    a = f"exit to {to.value}"
    if to not in (Status.FINISHED, Status.ABORTED, Status.PREEMPTED):
        raise PreconditionError(a, "not an exit status")
    if s.status.get(r) is not Status.RUNNING and not (to is Status.ABORTED and s.status.get(r) in QUEUED):
        raise PreconditionError(a, f"request {r} is {s.status.get(r)}")
    cache = actions.release(s.cache, r, writes) if r in s.cache.requests else s.cache
    started = dict(s.started)
    if writes:
        started[TransferId(s.cache.next_transfer)] = s.now
    return replace(s, cache=cache, status={**s.status, r: to}, started=started)


def inv_request(s: SchedulerState) -> list[Violation]:
    """INV-REQUEST: each request is in exactly one state; only a running one holds blocks."""
    out: list[Violation] = []
    for r, st in s.status.items():
        holds = r in s.cache.requests
        if holds != (st is Status.RUNNING):
            out.append(Violation("INV-REQUEST", f"request {r} is {st.value} but {'holds' if holds else 'holds no'} blocks"))
    for r in s.cache.requests:
        if r not in s.status:
            out.append(Violation("INV-REQUEST", f"the cache holds blocks for unknown request {r}"))
    return out


def live_exit(before: SchedulerState, after: SchedulerState, r: RequestId) -> list[Violation]:
    """LIVE-EXIT: within its exit step, every block r listed is free, a tree node's, still
    listed by another live request, or owned by a transfer that will free it."""
    return live_exit_cache(before.cache, after.cache, r)


def live_exit_cache(before: CacheState, after: CacheState, r: RequestId) -> list[Violation]:
    """LIVE-EXIT over the cache states around r's exit step."""
    if r not in before.requests:
        return []
    listed = actions.table(before, r)
    claims = gpu_claims(after)
    out: list[Violation] = []
    if r in after.requests:
        out.append(Violation("LIVE-EXIT", f"request {r} still holds blocks after its exit"))
    for g in listed:
        owners = claims.get(g, [])
        if not owners:
            out.append(Violation("LIVE-EXIT", f"GPU block {g} of request {r} was lost on exit: nobody owns it"))
        for o in owners:
            if isinstance(o, OwnedByRequest) and o.request == r:
                out.append(Violation("LIVE-EXIT", f"GPU block {g} is still owned by exited request {r}"))
            elif not isinstance(o, Free | OwnedByNode | OwnedByRequest | InFlight):
                out.append(Violation("LIVE-EXIT", f"GPU block {g} has an unknown owner"))
    return out


def live_transfer(s: SchedulerState) -> list[Violation]:
    """LIVE-TRANSFER: every transfer completes or times out within `timeout` ticks."""
    out: list[Violation] = []
    for t in s.cache.transfers:
        began = s.started.get(t)
        if began is None:
            out.append(Violation("LIVE-TRANSFER", f"transfer {t} has no start time"))
        elif s.now - began > s.timeout:
            out.append(Violation("LIVE-TRANSFER", f"transfer {t} in flight for {s.now - began} ticks (timeout {s.timeout})"))
    return out

