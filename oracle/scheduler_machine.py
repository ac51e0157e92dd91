"""The scheduler-level stateful machine: requests arrive, are scheduled, grow, are
preempted, finish and abort, while storage and swap I/O fail in every way the fault
model allows, through the scheduler adapter Protocol (oracle.serving). The fault of
each I/O call is a rule argument, so shrinking minimises the faults too.

The machine keeps its own record of the specification's state: it replays the spec
actions each call reports (spec.scheduler.Event) and advances the record's clock by
the ticks it makes itself. After every step it evaluates spec's properties on the
engine's abstraction and observations (INV-*, INV-REQUEST, INV-CONTENT), LIVE-TRANSFER
on its own clock, LIVE-EXIT on every exit (those the scheduler makes itself included),
and refinement against the record. Teardown: LIVE-DRAIN. An exception escaping a
call is a finding (LIVE-EXIT on exit paths, VALID-INPUT elsewhere), never a crash.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle import random_programs, threads, watchdog
from kvoracle.oracle.audit import Audit, walk
from kvoracle.oracle.cache_machine import PROMPTS, Tally
from kvoracle.oracle.disk import DAMAGE
from kvoracle.oracle.engine import SCHEDULER_LEVEL, BadInput, call_starts, scheduler_view
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.interrupts import stops
from kvoracle.oracle.serving import SchedulerAdapter
from kvoracle.oracle.violations import PropertyViolated, abstraction_gone, raised_on_valid_call, refused
from kvoracle.spec import liveness, scheduler
from kvoracle.spec.actions import Complete, PreconditionError
from kvoracle.spec.scheduler import Event
from kvoracle.spec.invariants import Violation
from kvoracle.spec.refinement import not_a_step, refines
from kvoracle.spec.state import EXITED, Status, System, blocks_for
from kvoracle.spec.types import RequestId, describe
from kvoracle.spec.view import View, of_system, request_name

FAULTS: tuple[Fault, ...] = (
    Fault(FaultKind.RAISE),
    Fault(FaultKind.ERROR),
    Fault(FaultKind.PARTIAL, done=0),
    Fault(FaultKind.PARTIAL, done=1),
    Fault(FaultKind.PARTIAL, done=64),  # more than any batch: the reference's I/O does every item and says partial
    Fault(FaultKind.HANG),
    Fault(FaultKind.LATE, delay=2),
    Fault(FaultKind.TWICE, delay=1),
    Fault(FaultKind.LATE, delay=6),  # answers after the timeout: a late completion
)
OK = Fault(FaultKind.OK)


FAULT_RATE = [0.3]  # the campaign's fault rate, read when a fault is drawn
# The faults the engine under test can suffer (its adapter's `fault_kinds`), read when a
# fault is drawn: a synchronous engine cannot hang a call and answer it later, say.
FAULT_POOL: list[tuple[Fault, ...]] = [FAULTS]


def use_faults(kinds: frozenset[FaultKind] | None) -> None:
    """Draw only faults of these kinds from now on (None: every kind)."""
    FAULT_POOL[0] = FAULTS if kinds is None else tuple(f for f in FAULTS if f.kind in kinds) or (OK,)


IO_CALLS = 8  # faults one step can inject: more I/O calls than any step makes
_MIX = (0x9E3779B97F4A7C15, 0x632BE59BD9B4E019, 0xBF58476D1CE4E5B9)  # how _faults mixes its integer


def _faults(u: int) -> tuple[Fault, ...]:
    """The faults of the I/O calls of one step, in order, that a drawn integer stands
    for: each call fails with the campaign's fault rate, in a kind of the fault model.
    The integer is mixed first: Hypothesis draws small numbers and constants it finds in
    loaded modules far more often than others, which otherwise skews the rate and the
    kinds and makes them depend on what the process imported. 0, where shrinking goes,
    is no fault at all."""
    out: list[Fault] = []
    x, (a, b, c) = u, _MIX
    for _ in range(IO_CALLS if u else 0):
        x = (x * a + b) & (2**64 - 1)
        z = ((x ^ (x >> 31)) * c) & (2**64 - 1)
        z ^= z >> 29
        pool = FAULT_POOL[0]
        out.append(OK if z % 1000 < 1000 * (1 - FAULT_RATE[0]) else pool[(z // 1000) % len(pool)])
    return tuple(out)


SEARCHED = 1 << 21  # the integers `fewer_faults` searches for a draw of a given list of faults


def fewer_faults(u: int) -> list[int]:
    """Integers whose faults are simpler than u's, simplest first: 0 (no fault at all);
    then, for each of u's faults, u's faults with that call succeeding; then with that
    fault replaced by one earlier in the fault pool (a raise before a partial before a
    hang before a late answer); every other call as it was. Each is the least integer
    drawing those faults among the first SEARCHED (a list of up to four faults nearly
    always is one, of five most often). The order, fewer faults then earlier ones, is
    well founded; mixing puts it out of reach of the integer's own."""
    faults, pool = _faults(u), FAULT_POOL[0]
    real = [i for i, f in enumerate(faults) if f.kind is not FaultKind.OK]
    wanted = [(*faults[:i], OK, *faults[i + 1:]) for i in real if len(real) > 1]
    wanted += [(*faults[:i], earlier, *faults[i + 1:]) for i in real if faults[i] in pool
               for earlier in pool[: pool.index(faults[i])]]
    drawn = _first_draws()
    found = ([0] if u else []) + [n for n in map(drawn.least, wanted) if n is not None]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class FirstDraws:
    """Every list of faults an integer in 1..SEARCHED draws, each as a code (a number in
    base len(values), a call's digit its fault's place in `values`), sorted, with the
    least integer that draws it."""

    values: tuple[Fault, ...]  # OK first, then the pool's faults
    codes: npt.NDArray[np.int64]
    first: npt.NDArray[np.int64]

    def least(self, faults: tuple[Fault, ...]) -> int | None:
        """The least integer that draws `faults`, if one in 1..SEARCHED does."""
        code = sum(self.values.index(f) * len(self.values) ** i for i, f in enumerate(faults))
        at = int(np.searchsorted(self.codes, code))
        return int(self.first[at]) if at < len(self.codes) and self.codes[at] == code else None


def _first_draws() -> FirstDraws:
    """FirstDraws under the campaign's rate and fault pool (built once for each, when a
    shrink first asks)."""
    return _first_draws_under(FAULT_RATE[0], FAULT_POOL[0])


@functools.lru_cache(maxsize=1)
def _first_draws_under(rate: float, pool: tuple[Fault, ...]) -> FirstDraws:
    """_faults of every integer in 1..SEARCHED at once, in numpy's 64-bit integers
    (whose products wrap as _faults's masks do); tests/test_random_programs.py holds the
    two to the same draws."""
    values = (OK, *[f for f in pool if f != OK])
    place = np.array([values.index(f) for f in pool], dtype=np.int64)
    a, b, c = (np.uint64(k) for k in _MIX)
    x = np.arange(1, SEARCHED + 1, dtype=np.uint64)
    codes = np.zeros(SEARCHED, dtype=np.int64)
    for i in range(IO_CALLS):
        x = x * a + b
        z = (x ^ (x >> np.uint64(31))) * c
        z ^= z >> np.uint64(29)
        fails = z % np.uint64(1000) >= 1000 * (1 - rate)
        codes += np.where(fails, place[(z // np.uint64(1000) % np.uint64(len(pool))).astype(np.int64)], 0) \
            * len(values) ** i
    unique, first = np.unique(codes, return_index=True)  # the first of each: the least integer
    return FirstDraws(values, unique, first + 1)


faults = st.integers(0, 2**32 - 1).map(_faults)
random_programs.shrink_mapped_by(_faults, fewer_faults)


def _widen(engine: SchedulerAdapter) -> int:
    """Tokens per prompt token: prompts are written for blocks of 2 tokens."""
    return max(1, engine.block_size // 2)


def usable(engine: SchedulerAdapter) -> int:
    """The GPU blocks the engine may give requests: its pool less its declared `reserve`."""
    return engine.gpu_blocks - int(getattr(engine, "reserve", 0))


def _room(engine: SchedulerAdapter) -> int:
    """The longest prompt (in prompt tokens, before widening) the engine must accept and
    admit: its tokens and its first decode token fill the usable GPU pool (spec's submit)."""
    return (usable(engine) * engine.block_size - 1) // _widen(engine)


def _family(prompts: Sequence[Sequence[int]], engine: SchedulerAdapter) -> tuple[tuple[int, ...], ...]:
    """An adapter's prompt family, checked: 1 to 12 prompts (the rule draws 0..11), each
    non-empty, of tokens >= 0, each fitting the GPU pool (a token is half a block)."""
    family = tuple(tuple(int(t) for t in q) for q in prompts)
    room = _room(engine)
    if not 0 < len(family) <= 12 or any(not q or min(q) < 0 or len(q) > room for q in family):
        raise ValueError(f"{engine.name}: prompts must be 1 to 12 non-empty tuples of tokens >= 0, each at most "
                         f"{room} long (with its first decode token, the GPU pool; a token half a block), "
                         f"not {prompts!r}")
    return family


class SchedulerMachine(RuleBasedStateMachine):
    make_adapter: Callable[[], SchedulerAdapter] = ReferenceScheduler
    bookkeeping = True  # False: check INV-CONTENT alone (shows the bytes catch what counters miss)
    tally = Tally()

    def __init__(self) -> None:
        super().__init__()
        watchdog.kick()  # building the engine is watched too
        with threads.building():  # the engine's threads watched from here to the teardown
            self.engine = type(self).make_adapter()
            self.model: System | None = self.engine.state()  # the checker's record (None: not refinable)
            self.prompts = _family(getattr(self.engine, "prompts", PROMPTS), self.engine)
        self.clock = 0  # the checker's own clock: the ticks it made
        self.seen: dict[object, int] = {}  # transfer -> tick the checker first saw it in flight
        self.next_request = 0
        self.injected = 0
        self.mark = 0  # engine calls made before the current one (for reproductions)
        self.lengths: dict[str, int] = {}  # request -> its prompt's tokens
        self.fresh: set[str] = set()  # requests never admitted yet
        self.streak = liveness.Streak()  # the latest scheduling steps in a row that stalled, stood still
        self.admission: tuple[dict[str, int], int] = ({}, 0)  # the last scheduling step's needs, transfers before
        self.growth: dict[str, int] = {}  # the last scheduling step's needs of the running requests
        self.furthest: dict[str, int] = {}  # request -> the most tokens it was seen computed (LIVE-PROGRESS)
        self.audit = Audit()
        self.refining: tuple[System, int] | None = None  # the record before the latest call, and its ticks
        # The look after the latest call, which is the look before the next where nothing can
        # change in between (no other thread alive: threads.quiet); None: look again
        self.settled: tuple[View, Mapping[RequestId, Status]] | None = None

    # --- checking -----------------------------------------------------------------------

    def view(self) -> View:
        e = self.engine
        return scheduler_view(e.observe(), e.observe_cpu(), [request_name(r) for r in self._live()], e.block_size)

    def latest_view(self) -> View:
        """The view after the latest call: the one it took, where nothing can have changed
        since (`settled`), else a fresh look."""
        return self.settled[0] if self.settled is not None else self.view()

    def _call(self, name: str, call: Callable[[], object], exiting: Sequence[RequestId] = (),
              ticks: int = 0, admitting: bool = False) -> None:
        """Run one scheduler call; check every property after it: LIVE-EXIT first, on the
        requests it was to end (`exiting`) and on those it ended or preempted itself;
        `ticks`: the time the call lets pass; `admitting`: a scheduling step (LIVE-ADMIT)."""
        self.mark = call_starts(self.engine)
        before, statuses = self.settled or (self.view(), self.engine.statuses())
        self.settled = None
        self.furthest = liveness.most_computed(self.furthest, before)
        admission = self._admission_before(before) if admitting else None
        escaped: BaseException | None = None
        try:
            call()
        except BaseException as e:  # storage or swap errors must never escape the scheduler
            if stops(e):
                raise
            escaped = e
        self.clock += ticks
        self._count(name)
        if self.fresh:  # a request seen out of the queue has been admitted
            waiting = {request_name(r) for r in self.engine.waiting()}
            self.fresh &= waiting
        found = self.engine.content()
        if self.bookkeeping:
            calm = threads.quiet()  # before the look and after it: no thread changed the engine meanwhile
            after, now = self.view(), self.engine.statuses()
            self.settled = (after, now) if calm and threads.quiet() else None
            found = self._bookkeeping(name, before, after, statuses, now, exiting, escaped, ticks) + found
            if admission is not None:
                found += self._scheduled(before, after, *admission)
            else:
                self.streak = liveness.between(self.streak, ticks > 0 or name == "submit", bool(self.engine.running()))
        # bookkeeping off: the engine's own validation (a refused double free) is one of
        # the checks switched off; INV-CONTENT alone judges
        if found:
            raise PropertyViolated(name, found)

    def _bookkeeping(self, name: str, before: View, after: View, statuses: Mapping[RequestId, Status],
                     now: Mapping[RequestId, Status], exiting: Sequence[RequestId], escaped: BaseException | None,
                     ticks: int) -> list[Violation]:
        e = self.engine
        ended = {r for r, s in now.items() if s is not statuses.get(r) and s in (*EXITED, Status.PREEMPTED)}
        # storage or swap errors must never escape the scheduler; one that did comes first:
        # the state it left half-changed is what the properties after it see
        found = [] if escaped is None else [raised_on_valid_call(name, escaped)]
        found += [v for r in sorted(ended | set(exiting)) for v in liveness.live_exit(before, after, request_name(r))]
        got = e.state()
        if self.audit.due():
            found += walk(None if got is None else of_system(got), e.invariants(), after)
        return found + threads.died(name) + self._record(name, ticks, got)

    def _record(self, name: str, ticks: int, got: System | None) -> list[Violation]:
        """LIVE-TRANSFER on the checker's clock, and refinement: the record replays what
        the engine reports it did, and must equal the engine's abstraction."""
        timeout = self.engine.timeout
        if self.model is None:
            live = set(self.engine.transfers())
            self.seen = {t: self.seen.get(t, self.clock) for t in live}
            return liveness.live_transfer(self.seen, self.clock, timeout)
        self.refining = (self.model, ticks)  # what a reproduction of a REFINEMENT here replays
        events = list(self.engine.events() or ())
        model = next_record(self.model, name, ticks, events)
        if isinstance(model, Violation):
            return [model]
        for event in events:
            if isinstance(event, Complete):
                self._ended(describe(event.outcome).split("(")[0])
        self.model = model
        found = liveness.live_transfer(model.started, model.now, timeout)
        if got is None:
            return found + [abstraction_gone(name, "state")]
        return found + [Violation(v.id, f"after {name} {v.message}") for v in refines(model, got)]

    def _admission_before(self, before: View) -> tuple[dict[str, int], dict[str, int], int]:
        """What LIVE-ADMIT and LIVE-PROGRESS need from before a scheduling step: the
        blocks each queued request needs (from the record, else the prompts of those never
        admitted), those each running request needs to grow (from the record, else its
        prompt or its computed tokens, whichever is more), and the transfers in flight."""
        flying = len(self.engine.transfers())
        if self.model is not None:
            return liveness.needs(self.model), liveness.needs(self.model, among=(Status.RUNNING,)), flying
        size = self.engine.block_size
        growth = {r: blocks_for(max(self.lengths.get(r, 0), n) + 1, size) for r, n in (before.computed or {}).items()}
        return {r: blocks_for(n + 1, size) for r, n in self.lengths.items() if r in self.fresh}, growth, flying

    def _scheduled(self, before: View, after: View, needs: dict[str, int], growth: dict[str, int],
                   flying: int) -> list[Violation]:
        """LIVE-ADMIT and LIVE-PROGRESS on the latest scheduling steps in a row."""
        self.admission, self.growth = (needs, flying), growth
        room, in_flight = usable(self.engine), (flying, len(self.engine.transfers()))
        self.streak = liveness.scheduled(self.streak, before, after, needs, growth, room, in_flight, self.furthest)
        return liveness.streak_violations(self.streak)

    def _ended(self, outcome: str) -> None:
        ended = type(self).tally.outcomes
        ended[outcome] = ended.get(outcome, 0) + 1

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1
        now = self.engine.faults_injected()
        t.faults += now - self.injected
        self.injected = now

    def _live(self) -> list[RequestId]:
        """The requests that have not exited, in order."""
        return sorted(r for r, s in self.engine.statuses().items() if s not in EXITED)

    def _running(self, i: int) -> RequestId | None:
        run = self.engine.running()
        return run[i % len(run)] if run else None

    # --- rules -----------------------------------------------------------------------------

    @rule(p=st.integers(0, 12), tail=st.integers(0, 3))
    def submit(self, p: int, tail: int) -> None:
        """A prompt from the shared family (the adapter's `prompts`, else PROMPTS), then
        `tail` own tokens (new blocks to write); p = 12: the largest prompt the engine must
        accept, the family's first filled up with own tokens (the boundary of submit and
        of admission: it needs the whole GPU pool)."""
        if len(self.engine.running()) + len(self.engine.waiting()) >= 5:
            return
        r = RequestId(self.next_request)
        self.next_request += 1
        family = self.prompts
        widen = _widen(self.engine)
        shared = family[p % len(family)]
        # own tokens, above the family: new blocks; no more than the GPU pool holds (a larger
        # prompt is a bad input, TOO_LARGE, and would wait at the head of the queue for ever)
        tail = _room(self.engine) - len(shared) if p == 12 else min(tail, _room(self.engine) - len(shared))
        own = (r + 1 + max(max(q) for q in family),) * tail
        tokens = tuple(t for t in shared + own for _ in range(widen))
        self.lengths[request_name(r)] = len(tokens)
        self.fresh.add(request_name(r))
        self._call("submit", lambda: self.engine.submit(r, tokens))

    @rule(f=faults)
    def schedule(self, f: tuple[Fault, ...]) -> None:
        self._call("schedule", lambda: self.engine.schedule(f), admitting=True)

    @precondition(lambda m: bool(m.engine.running()))
    @rule(picks=st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True), f=faults)
    def finish(self, picks: list[int], f: tuple[Fault, ...]) -> None:
        batch = sorted({r for i in picks if (r := self._running(i)) is not None})
        if batch:
            # the engine gets a copy: what it does to its argument cannot change which requests are judged
            self._call("finish", lambda: self.engine.finish(list(batch), f), exiting=batch)

    @precondition(lambda m: bool(m.engine.running()))
    @rule(i=st.integers(0, 7), f=faults)
    def preempt(self, i: int, f: tuple[Fault, ...]) -> None:
        r = self._running(i)
        if r is not None:
            self._call("preempt", lambda: self.engine.preempt(r, f), exiting=[r])

    @precondition(lambda m: bool(m._live()))
    @rule(i=st.integers(0, 7), f=faults)
    def abort(self, i: int, f: tuple[Fault, ...]) -> None:
        live = self._live()
        r = live[i % len(live)]
        self._call("abort", lambda: self.engine.abort(r, f), exiting=[r])

    @rule(n=st.integers(1, 3), pressure=st.integers(0, 3))
    def tick(self, n: int, pressure: int) -> None:
        """Time passes; one tick in four, memory pressure from outside the requests
        (another tenant, a prefix-cache reset) follows: every block that can go leaves the
        GPU, then the CPU tier, so a prompt that comes back finds its blocks in storage
        only. Pressure is part of tick, not a rule of its own: an argument-free rule
        took half of all steps and starved finish and its faults."""
        self._call("tick", lambda: self.engine.tick(n), ticks=n)
        if pressure == 0:
            self._call("evict", self.engine.evict_all)

    @rule(kind=st.sampled_from(SCHEDULER_LEVEL))
    def bad_input(self, kind: BadInput) -> None:
        """A bad call must raise the adapter's declared exception and change nothing."""
        error = self.engine.refusals.get(kind)
        if error is not None:
            self.settled = None  # a call outside _call: what it changed, the next call's look must see
            self.mark = call_starts(self.engine)
            refused(kind.value, error, lambda: self.engine.bad_call(kind), self.engine.snapshot,
                    lambda: self._made_bad_call(kind.value))

    def _made_bad_call(self, name: str) -> None:
        type(self).tally.bad_inputs += 1
        self._count(name)
        threads.check(name)

    # --- LIVE-DRAIN -------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.model is None:  # a black box reports how its transfers ended, if it can
                for outcome, n in getattr(self.engine, "outcomes", dict)().items():
                    for _ in range(n):
                        self._ended(outcome)
            if sys.exc_info()[0] is not None:
                return
            self.audit.draining = True
            drain(self)
            if self.bookkeeping:  # off: INV-CONTENT alone judges
                threads.check("the drain")  # a thread that died after the last call
        finally:
            watchdog.pause()
            threads.unwatch()


class DiskMachine(SchedulerMachine):
    """The scheduler machine for an engine whose storage tier is on files (an adapter
    that offers `damage_storage`): between calls the disk damages it, and the engine
    must read around what it lost. A machine of its own, so that the other machines'
    draws do not move."""

    @rule(how=st.sampled_from(DAMAGE), i=st.integers(0, 7))
    def damage(self, how: str, i: int) -> None:
        self._call("damage", lambda: getattr(self.engine, "damage_storage")(how, i))


def next_record(model: System, name: str, ticks: int, events: Sequence[Event]) -> System | Violation:
    """spec's state after `ticks` ticks and the actions the engine reported for its call
    `name`, or REFINEMENT where spec refuses one of them."""
    after = scheduler.tick(model, ticks)
    try:
        for event in events:
            after = scheduler.apply(after, event)
    except PreconditionError as err:
        return not_a_step(name, err)
    return after


def scheduler_level_machine(adapter: object) -> type[SchedulerMachine]:
    """The scheduler-level machine an adapter (its class, or a factory) calls for."""
    return DiskMachine if hasattr(adapter, "damage_storage") else SchedulerMachine


def drain_ticks(engine: SchedulerAdapter) -> int:
    """Ticks the drain may take: until every transfer has answered or timed out (past the
    timeout and the latest fault's answer), then spec's drain bound. Each tick's evict_all
    takes only the GPU's current leaves, and a leaf's parent goes a tick later, once its
    swap-out has ended: one request's long chain takes a tick per block."""
    answered = engine.timeout + max(f.delay for f in FAULTS)
    return answered + liveness.drain_bound(engine.gpu_blocks, engine.cpu_blocks, len(engine.statuses()))


def drain(m: SchedulerMachine) -> None:
    """The drain LIVE-DRAIN judges: abort every request, let every transfer answer or time out, evict
    everything: all blocks free within a bounded number of ticks."""
    e = m.engine
    for r in m._live():
        m._call("drain:abort", lambda: e.abort(r, ()), exiting=[r])
    for _ in range(drain_ticks(e)):
        m._call("drain:evict", e.evict_all)
        if not m.bookkeeping or not liveness.drained(m.latest_view(), len(e.transfers())):
            return  # bookkeeping off: the free lists are not judged, INV-CONTENT alone is
        m._call("drain:tick", lambda: e.tick(1), ticks=1)
    left = liveness.drained(m.latest_view(), len(e.transfers()))  # after the last tick: drained by it, or not
    if left:
        raise PropertyViolated("drain", left)
