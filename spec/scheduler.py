"""The system's actions: a scheduler's request lifecycle on top of the cache layer.

Each is a pure function System -> System with an enabling condition (PreconditionError
when it does not hold), and each exists as data too (`Event`, replayed by `apply`).
The implementation's choices are arguments: which blocks a match fills and allocates,
how many tokens a prefill chunk computes, which writes an exit starts, which nodes
eviction takes, how each transfer ends. Time is a variable: a transfer is started at
`now`, and a tick advances it (LIVE-TRANSFER bounds how long a transfer may stay).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from kvoracle.spec import actions
from kvoracle.spec.actions import Complete, Evict, Reset, require
from kvoracle.spec.frozen import replace
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.state import EXITED, QUEUED, CacheState, Request, Status, System, blocks_for, due
from kvoracle.spec.types import BlockHash, GpuBlock, Outcome, RequestId, Timeout, TransferId

EXITS = (Status.FINISHED, Status.ABORTED, Status.PREEMPTED)


@functools.lru_cache(maxsize=4096)
def full_hashes(tokens: tuple[int, ...], block_size: int) -> tuple[BlockHash, ...]:
    """The chained hash of every full block of `tokens`."""
    return block_hashes(tokens, block_size)


def hashes(s: System, r: RequestId) -> tuple[BlockHash, ...]:
    return full_hashes(s.requests[r].tokens, s.block_size)


def _with_cache(s: System, cache: CacheState) -> System:
    """s with a new cache state: transfers that ended leave the clock's record, new
    ones start now."""
    if cache.transfers.keys() == s.started.keys():
        return replace(s, cache=cache)  # no transfer started or ended
    started = {t: at for t, at in s.started.items() if t in cache.transfers}
    for t in cache.transfers:
        if t >= s.cache.next_transfer:
            started[t] = s.now
    return replace(s, cache=cache, started=started)


def _put(s: System, r: RequestId, q: Request) -> System:
    return replace(s, requests={**s.requests, r: q})


def _running(s: System, r: RequestId, a: str) -> Request:
    q = s.requests.get(r)
    require(q is not None and q.status is Status.RUNNING, a, f"request {r} is {q.status.value if q else 'unknown'}")
    assert q is not None
    return q


# --- the actions ---------------------------------------------------------------------------


def submit(s: System, r: RequestId, tokens: Sequence[int]) -> System:
    """A new request joins the waiting queue."""
    a = "submit"
    require(r not in s.requests, a, f"request {r} was submitted before")
    require(bool(tokens), a, f"request {r} has no tokens")
    need = blocks_for(len(tokens) + 1, s.block_size)
    require(need <= s.cache.gpu_size, a, f"request {r} needs {need} blocks, the GPU has {s.cache.gpu_size}")
    return replace(s, requests={**s.requests, r: Request(Status.WAITING, tuple(tokens))})


def admit(s: System, r: RequestId, swap_dests: Sequence[GpuBlock] = (),
          prefetch_dests: Sequence[GpuBlock] = ()) -> System:
    """A queued request starts running: it matches its cached prefix (a GPU hit takes a
    reference, a CPU hit starts a swap-in into a swap dest, a storage hit a prefetch into
    a prefetch dest); what matched counts as computed. Its other blocks come by prefill."""
    a = "admit"
    q = s.requests.get(r)
    require(q is not None and q.status in QUEUED, a, f"request {r} is {q.status.value if q else 'unknown'}")
    assert q is not None
    want = hashes(s, r)
    cache = actions.match(s.cache, r, want, swap_dests, prefetch_dests)
    hits = actions.gpu_hits(s.cache, want) + len(swap_dests) + len(prefetch_dests)
    s = _with_cache(s, cache)
    return _put(s, r, replace(q, status=Status.RUNNING, computed=min(len(q.tokens), hits * s.block_size),
                              admissions=q.admissions + 1))


def prefill(s: System, r: RequestId, tokens: int, blocks: Sequence[GpuBlock] = ()) -> System:
    """The next chunk of r's prompt: `tokens` more tokens get their KV computed, into its
    table grown by the free `blocks`; the table must then cover every computed token."""
    a = "prefill"
    q = _running(s, r, a)
    require(0 < tokens <= len(q.tokens) - q.computed, a, f"a chunk of {tokens} tokens, "
                                                          f"{len(q.tokens) - q.computed} left to compute")
    cache = actions.allocate(s.cache, r, blocks)
    need = blocks_for(q.computed + tokens, s.block_size)
    require(len(actions.table(cache, r)) >= need, a, f"the table holds {len(actions.table(cache, r))} blocks, "
                                                      f"{need} are computed")
    return _put(_with_cache(s, cache), r, replace(q, computed=q.computed + tokens))


def decode(s: System, r: RequestId, token: int, blocks: Sequence[GpuBlock] = ()) -> System:
    """A ready, fully computed request appends one token, growing its table by `blocks`."""
    a = "decode"
    q = _running(s, r, a)
    require(q.computed == len(q.tokens), a, f"request {r} has {len(q.tokens) - q.computed} tokens to prefill")
    require(actions.ready(s.cache, r), a, f"request {r} still has blocks in flight")
    cache = actions.allocate(s.cache, r, blocks)
    need = blocks_for(len(q.tokens) + 1, s.block_size)
    require(len(actions.table(cache, r)) >= need, a, f"the table holds {len(actions.table(cache, r))} blocks, "
                                                      f"{need} are needed")
    return _put(_with_cache(s, cache), r, replace(q, tokens=q.tokens + (token,), computed=q.computed + 1))


def insert(s: System, r: RequestId, blocks: int) -> System:
    """r's first `blocks` full, computed blocks become tree nodes (actions.commit)."""
    a = "insert"
    q = _running(s, r, a)
    require(0 <= blocks <= q.computed // s.block_size, a, f"{blocks} blocks, {q.computed // s.block_size} computed")
    return _with_cache(s, actions.commit(s.cache, r, hashes(s, r)[:blocks]))


def exit_request(s: System, r: RequestId, to: Status, writes: Sequence[tuple[BlockHash, GpuBlock]] = ()) -> System:
    """finish (to FINISHED), abort (to ABORTED) or preempt (to PREEMPTED): start the
    write, then release r's blocks whatever the write will do. A queued request may be
    aborted (it holds nothing)."""
    a = f"exit to {to.value}"
    require(to in EXITS, a, "not an exit status")
    q = s.requests.get(r)
    status = q.status if q is not None else None
    require(status is Status.RUNNING or (to is Status.ABORTED and status in QUEUED), a, f"request {r} is {status}")
    assert q is not None
    cache = actions.release(s.cache, r, writes) if r in s.cache.requests else s.cache
    return _put(_with_cache(s, cache), r, replace(q, status=to, computed=0))


def evict(s: System, steps: Sequence[actions.EvictStep]) -> System:
    return _with_cache(s, actions.evict(s.cache, steps))


def complete(s: System, t: TransferId, outcome: Outcome) -> System:
    """Transfer t ends (actions.complete). A swap-in or prefetch that failed for a live
    request leaves it blocks to recompute: what counts as computed does not change. It
    times out only once it has been in flight `timeout` ticks (Next times it out on the
    tick that brings it there; LIVE-TRANSFER holds it to that tick): a timeout before
    gives up on an answer that may still come in time."""
    if isinstance(outcome, Timeout) and t in s.cache.transfers:
        require(t in s.started, "complete", f"transfer {t} is in flight with no start time")
        require(due(s.started[t], s.now, s.timeout), "complete", f"transfer {t} timed out after "
                f"{s.now - s.started[t]} ticks in flight, before its timeout of {s.timeout}")
    return _with_cache(s, actions.complete(s.cache, t, outcome))


def tick(s: System, ticks: int = 1) -> System:
    """Time passes."""
    require(ticks >= 0, "tick", f"{ticks} ticks")
    return replace(s, now=s.now + ticks)


def reset(s: System) -> System:
    """From quiescence (no running request): actions.reset."""
    running = sorted(r for r, q in s.requests.items() if q.status is Status.RUNNING)
    require(not running, "reset", f"requests {running} are running")
    return _with_cache(s, actions.reset(s.cache))


def live(s: System) -> list[RequestId]:
    """Requests that have not exited, in id order."""
    return sorted(r for r, q in s.requests.items() if q.status not in EXITED)


# --- the actions as data --------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    request: RequestId
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Admit:
    request: RequestId
    swap_dests: tuple[GpuBlock, ...] = ()
    prefetch_dests: tuple[GpuBlock, ...] = ()


@dataclass(frozen=True)
class Prefill:
    request: RequestId
    tokens: int
    blocks: tuple[GpuBlock, ...] = ()


@dataclass(frozen=True)
class Decode:
    request: RequestId
    token: int
    blocks: tuple[GpuBlock, ...] = ()


@dataclass(frozen=True)
class Insert:
    request: RequestId
    blocks: int


@dataclass(frozen=True)
class Exit:
    request: RequestId
    to: Status
    writes: tuple[tuple[BlockHash, GpuBlock], ...] = ()


@dataclass(frozen=True)
class Tick:
    ticks: int = 1


Event = Submit | Admit | Prefill | Decode | Insert | Exit | Evict | Complete | Tick | Reset


def apply(s: System, e: Event) -> System:
    """The system action an event names, with the choices it carries. (Tested in order
    of how often they come: completions are most of a model check's steps.)"""
    if isinstance(e, Complete):
        return complete(s, e.transfer, e.outcome)
    if isinstance(e, Exit):
        return exit_request(s, e.request, e.to, e.writes)
    if isinstance(e, Evict):
        return evict(s, e.steps)
    if isinstance(e, Tick):
        return tick(s, e.ticks)
    if isinstance(e, Admit):
        return admit(s, e.request, e.swap_dests, e.prefetch_dests)
    if isinstance(e, Prefill):
        return prefill(s, e.request, e.tokens, e.blocks)
    if isinstance(e, Insert):
        return insert(s, e.request, e.blocks)
    if isinstance(e, Decode):
        return decode(s, e.request, e.token, e.blocks)
    if isinstance(e, Submit):
        return submit(s, e.request, e.tokens)
    return reset(s)
