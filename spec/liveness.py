"""The liveness properties, each in the bounded form the checkers evaluate, with the
fairness it assumes. Like the safety predicates, each is evaluated on views (or on the
checker's own record of time), so a checker that sees less checks less, never
something else.

LIVE-EXIT     Fairness: none; an exit is one step. Bounded form: within the exit step.
LIVE-TRANSFER Fairness: time advances (ticks keep coming). Bounded form: no transfer is
              still in flight once `timeout` ticks of the checker's own clock have
              passed since it started (the tick that brings it there ends it).
LIVE-EVICT    Fairness: none. Bounded form: one eviction call, when evictable nodes
              exist and it is asked for at least one block, evicts at least one, and
              does not raise.
LIVE-ADMIT    Fairness: none. Bounded form: of the scheduling steps taken while no
              request runs, no transfer is in flight and a queued request fits the GPU
              pool, no more than ADMIT_GRACE in a row stall: each of the others admits
              a request, starts a transfer or frees a GPU block (which an idle engine
              can do only finitely often without admitting).
LIVE-PROGRESS Fairness: none. Bounded form: of the scheduling steps taken while requests
              run, each fitting the GPU pool on its own, and no transfer is in flight,
              no more than PROGRESS_GRACE in a row (only ticks, new requests and
              bad inputs between them) stand still: each of the others computes a token for a
              request that runs before and after it (a prefill chunk or a decode), or
              one that request never computed before (a new request's prefill), ends a
              running request, or starts a transfer.
LIVE-DRAIN    Fairness: every request can be ended, every transfer eventually
              answers, eviction runs. Bounded form: from the state at hand, the drain
              (abort every live request, complete every transfer, evict every
              evictable node, repeated) frees every block of both tiers within
              `drain_bound` rounds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvoracle.spec import scheduler
from kvoracle.spec.actions import Drop, EvictCpu, EvictStep, SkipStale, SwapOutTo
from kvoracle.spec.invariants import Violation, owners
from kvoracle.spec.state import QUEUED, CacheState, Status, System, blocks_for, cpu_evictable, due, gpu_evictable
from kvoracle.spec.types import Ok, Tier
from kvoracle.spec.view import FREE, View, of_system, request_name

K = TypeVar("K")


def live_exit(before: View, after: View, r: str) -> list[Violation]:
    """LIVE-EXIT: after r's exit step, r holds nothing, and every block its table listed
    is free, a cache node's, another live request's, or owned by a transfer that will
    free it."""
    if before.tables is None or after.tables is None or r not in before.tables:
        return []
    out: list[Violation] = []
    if r in after.tables:
        out.append(Violation("LIVE-EXIT", f"request {r} still holds blocks {list(after.tables[r])} after its exit"))
    claims = owners(after.gpu, after.owned_privately())
    if claims is None:
        return out
    for b in before.tables[r]:
        who = claims.get(b, [])
        if not who:
            out.append(Violation("LIVE-EXIT", f"GPU block {b} of request {r} was lost on exit: nobody owns it"))
        elif f"request {r}" in who:
            out.append(Violation("LIVE-EXIT", f"GPU block {b} is still owned by exited request {r}"))
    return out


def live_transfer(started: Mapping[K, int], now: int, timeout: int) -> list[Violation]:
    """LIVE-TRANSFER: no transfer is still in flight once it has been in flight for
    `timeout` ticks: the tick that brings it there answers it or times it out (as
    spec's Next does). Time passes only in ticks, so a transfer seen in flight at
    `timeout` ticks stays so until the next tick, into its `timeout + 1`-th. `started`
    is the checker's own record of when it first saw each transfer."""
    return [Violation("LIVE-TRANSFER", f"transfer {t} still in flight after {now - at} ticks (timeout {timeout})")
            for t, at in sorted(started.items(), key=lambda kv: str(kv[0])) if due(at, now, timeout)]


def live_evict(before: CacheState | None, evictable: int, need: int, steps: Sequence[EvictStep] | None,
               raised: BaseException | None = None) -> list[Violation]:
    """LIVE-EVICT: an eviction asked for `need` > 0 blocks, with `evictable` nodes there to
    take (counted on `before` when the state is known), evicts at least one and never
    raises. `steps` None: the evictions were not reported (only `raised` is judged)."""
    if raised is not None:
        return [Violation("LIVE-EVICT", f"eviction raised {raised!r}")]
    if before is not None:
        evictable = sum(1 for h in before.nodes if gpu_evictable(before, h))
    if need <= 0 or not evictable or steps is None:
        return []
    if any(isinstance(step, SwapOutTo | Drop) for step in steps):
        return []
    return [Violation("LIVE-EVICT", f"{evictable} evictable nodes exist but none was evicted")]


ADMIT_GRACE = 1  # scheduling steps in a row that may stall before LIVE-ADMIT is broken


def stall(before: View, after: View, needs: Mapping[str, int], room: int, in_flight: tuple[int, int]) -> str | None:
    """Why a scheduling step stalled, or None: it started idle (no live request outside
    the queue, no transfer in flight: `in_flight` counts them before and after) with
    requests queued, each of which fits (`needs`: the GPU blocks its tokens and the next
    one take, where known; `room`: the GPU blocks the engine may fill, its declared
    reserve left out), so that whichever it picks first can run; and it admitted no
    request, started no transfer and freed no GPU block."""
    if before.live is None or before.queued is None or after.queued is None:
        return None
    if before.gpu.free is None or after.gpu.free is None or in_flight[0] or before.live - before.queued:
        return None
    queued = sorted(before.queued, key=lambda r: (len(r), r))
    free = len(set(before.gpu.free))
    if not queued or any(needs.get(r, room + 1) > room for r in queued):
        return None
    if in_flight[1] or before.queued - after.queued or len(set(after.gpu.free)) > free:
        return None
    waited = ", ".join(f"{r} ({needs[r]})" for r in queued)
    return (f"no request ran and no transfer was in flight while {waited} waited, each fitting the {room} "
            f"GPU blocks ({free} free): no request was admitted, no transfer started, no block came free")


def live_admit(stalls: Sequence[str]) -> list[Violation]:
    """LIVE-ADMIT: no more than ADMIT_GRACE scheduling steps in a row stall (`stalls`: why
    each of the latest steps in a row did, oldest first; spec.liveness.stall). The grace
    is for an engine that takes up at its next step what happened between steps (vLLM
    admits nothing in the step that preempts)."""
    if len(stalls) <= ADMIT_GRACE:
        return []
    return [Violation("LIVE-ADMIT", f"{len(stalls)} scheduling steps in a row stalled: {stalls[-1]}")]


PROGRESS_GRACE = 1  # scheduling steps in a row that may stall before LIVE-PROGRESS is broken


def standstill(before: View, after: View, needs: Mapping[str, int], room: int,
               in_flight: tuple[int, int], furthest: Mapping[str, int]) -> str | None:
    """Why a scheduling step made no progress, or None: it started with requests running
    (`computed`: each running request's computed tokens), each fitting on its own (`needs`:
    the GPU blocks its tokens and the next one take; `room`: the GPU blocks the engine may
    fill), and no transfer in flight before or after it (`in_flight`); and no request that
    ran before and after it computed a token, none computed more tokens than it ever had
    before (`furthest`: the most each was seen computed: a new request's prefill counts,
    recomputing what a preemption threw away does not), and none that ran ended. A
    request that fits alone can always grow, by eviction or by preempting others, so a
    step that stands still chose not to: a livelock when it repeats (a request that
    preempts itself for ever, requests that preempt each other in turn)."""
    if before.computed is None or after.computed is None or before.live is None or after.live is None:
        return None
    running = sorted(before.computed, key=lambda r: (len(r), r))
    if not running or in_flight != (0, 0) or any(needs.get(r, room + 1) > room for r in running):
        return None
    if any(after.computed.get(r, -1) > before.computed[r] for r in running) or set(running) - after.live:
        return None
    if any(n > furthest.get(r, 0) for r, n in after.computed.items()):
        return None
    held = ", ".join(f"{r} ({before.computed[r]} tokens, {needs[r]} blocks)" for r in running)
    return (f"{held} ran with no transfer in flight, each fitting the {room} GPU blocks on its own: no request "
            f"that ran computed a token, none computed one it never had, none ended")


def live_progress(stalls: Sequence[str]) -> list[Violation]:
    """LIVE-PROGRESS: no more than PROGRESS_GRACE scheduling steps in a row stand still
    (`stalls`: why each of the latest steps in a row did, oldest first, with only ticks,
    new requests and bad inputs between them: an exit, an eviction or damage from
    outside starts the count again; spec.liveness.standstill). The grace is for an engine
    that takes up at its next step what it decided in this one."""
    if len(stalls) <= PROGRESS_GRACE:
        return []
    return [Violation("LIVE-PROGRESS", f"{len(stalls)} scheduling steps in a row made no progress: {stalls[-1]}")]


@dataclass(frozen=True)
class Streak:
    """Why each of the latest scheduling steps in a row stalled (LIVE-ADMIT) and stood
    still (LIVE-PROGRESS), oldest first: what a checker that sees scheduling steps keeps
    between them (`scheduled`, `between`) and judges (`streak_violations`)."""

    stalls: tuple[str, ...] = ()
    standstills: tuple[str, ...] = ()


def scheduled(streak: Streak, before: View, after: View, needs: Mapping[str, int], growth: Mapping[str, int],
              room: int, in_flight: tuple[int, int], furthest: Mapping[str, int]) -> Streak:
    """The streak after one scheduling step (`needs`: of the queued requests, for stall;
    `growth`: of the running ones, for standstill)."""
    stalled = stall(before, after, needs, room, in_flight)
    stood = standstill(before, after, growth, room, in_flight, furthest)
    return Streak(() if stalled is None else (*streak.stalls, stalled),
                  () if stood is None else (*streak.standstills, stood))


def between(streak: Streak, keeps_progress: bool, running: bool) -> Streak:
    """The streak after a call between scheduling steps. LIVE-PROGRESS's count goes on
    over a call that only lets time pass, adds a request, or takes in the results of the
    step before it (an engine that computes a step's tokens in a call of its own)
    (`keeps_progress`); any other (an exit, an eviction, damage from outside) starts it
    again. LIVE-ADMIT's starts again when a request runs after the call (the engine was
    not idle). A bad input that was refused is no call at all: the engine did nothing."""
    return Streak(() if running else streak.stalls, streak.standstills if keeps_progress else ())


def most_computed(seen: Mapping[str, int], v: View) -> dict[str, int]:
    """The most tokens each request was seen computed (standstill's `furthest`), once the
    running requests of view `v` are seen too."""
    out = dict(seen)
    for r, n in (v.computed or {}).items():
        out[r] = max(n, out.get(r, 0))
    return out


def streak_violations(streak: Streak) -> list[Violation]:
    return live_admit(streak.stalls) + live_progress(streak.standstills)


def judged(streak: Streak) -> Streak:
    """The streak cut to what judging the next step needs: a checker that reports each
    streak once may keep no more (a livelock can last as long as an engine serves)."""
    return Streak(streak.stalls[-(ADMIT_GRACE + 1):], streak.standstills[-(PROGRESS_GRACE + 1):])


def needs(s: System, admissions: int | None = None, among: Sequence[Status] = QUEUED) -> dict[str, int]:
    """The GPU blocks each request's tokens and the next one take: of the queued ones
    (LIVE-ADMIT), or of those `among` other statuses (the running ones: LIVE-PROGRESS);
    `admissions`: only requests admitted fewer times (a model checker's scope)."""
    return {request_name(r): blocks_for(len(q.tokens) + 1, s.block_size) for r, q in s.requests.items()
            if q.status in among and (admissions is None or q.admissions < admissions)}


def drained(v: View, in_flight: int = 0) -> list[Violation]:
    """LIVE-DRAIN: after the drain, every block of every tier is on the free list and
    no transfer is in flight (`in_flight`: how many the engine still has)."""
    out: list[Violation] = []
    if in_flight:
        out.append(Violation("LIVE-DRAIN", f"after draining, {in_flight} transfers are still in flight"))
    for t in v.tiers():
        if t.free is None:
            continue
        left = len(t.ids) - len(set(t.free) & set(t.ids))
        if left:
            out.append(Violation("LIVE-DRAIN", f"after draining, {left} of {len(t.ids)} {t.name} blocks are not "
                                               f"on {FREE}"))
    return out


def drain_bound(gpu_blocks: int, cpu_blocks: int, requests: int) -> int:
    """The rounds the drain may take: each round ends or frees at least one thing."""
    return 4 * (gpu_blocks + cpu_blocks + requests) + 8


def drain_step(s: System) -> System | None:
    """One step of the drain, or None when it has nothing left to do: abort a live
    request, else complete a transfer (ok), else evict: a CPU heap entry first, then a
    GPU one (stale entries are popped; a swap-out goes to a free CPU block)."""
    alive = scheduler.live(s)
    if alive:
        return scheduler.exit_request(s, alive[0], Status.ABORTED)
    if s.cache.transfers:
        return scheduler.complete(s, min(s.cache.transfers), Ok())
    step = _eviction(s.cache)
    return None if step is None else scheduler.evict(s, [step])


def _eviction(c: CacheState) -> EvictStep | None:
    if c.cpu_heap.entries:
        h = min(c.cpu_heap.entries)
        return EvictCpu(h) if cpu_evictable(c, h) else SkipStale(h, Tier.CPU)
    if c.gpu_heap.entries:
        h = min(c.gpu_heap.entries)
        if not gpu_evictable(c, h):
            return SkipStale(h, Tier.GPU)
        return SwapOutTo(h, c.cpu_free[0]) if c.cpu_free else Drop(h)
    return None


def drain(s: System) -> Iterator[System]:
    """The states the drain passes through, from s's successor on."""
    nxt = drain_step(s)
    while nxt is not None:
        yield nxt
        nxt = drain_step(nxt)


def live_drain(s: System, bound: int) -> list[Violation]:
    """LIVE-DRAIN from s, in at most `bound` drain steps (the spec's own drain)."""
    last, steps = s, 0
    for last in drain(s):
        steps += 1
        if steps > bound:
            return [Violation("LIVE-DRAIN", f"the drain took more than {bound} steps")]
    return drained(of_system(last), len(last.cache.transfers))
