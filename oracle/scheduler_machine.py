"""The scheduler-level stateful machine: requests arrive, are scheduled, grow, are
preempted, finish and abort, while storage and swap I/O fail in every way the fault
model allows, through the scheduler adapter Protocol (oracle.serving). The fault of
each I/O call is a rule argument, so shrinking minimises the faults too.

The reference (ReferenceScheduler) moves the KV data through real block pools
(numpy, or KV_BACKEND). After every step: every cache invariant, what the adapter's
observations allow, INV-REQUEST, LIVE-TRANSFER and INV-CONTENT; after every exit
(finish, abort, preempt, including those the scheduler makes itself): LIVE-EXIT.
Teardown: LIVE-DRAIN. Subclass and set `make_adapter` to check a mutant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle.cache_machine import PROMPTS, Tally
from kvoracle.oracle.engine import SCHEDULER_LEVEL, BadInput, check, check_tier, not_free, with_observed
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.serving import SchedulerAdapter
from kvoracle.oracle.violations import PropertyViolated, refused
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import EXITED, SchedulerState, Status, inv_request, live_exit, live_transfer
from kvoracle.spec.types import RequestId

FAULTS: tuple[Fault, ...] = (
    Fault(FaultKind.RAISE),
    Fault(FaultKind.ERROR),
    Fault(FaultKind.PARTIAL, done=0),
    Fault(FaultKind.PARTIAL, done=1),
    Fault(FaultKind.HANG),
    Fault(FaultKind.LATE, delay=2),
    Fault(FaultKind.TWICE, delay=1),
    Fault(FaultKind.LATE, delay=6),  # answers after the timeout: a late completion
)
OK = Fault(FaultKind.OK)


FAULT_RATE = [0.3]  # the campaign's fault rate, read when a fault is drawn


def _fault(u: int) -> Fault:
    return OK if u < 1000 * (1 - FAULT_RATE[0]) else FAULTS[u % len(FAULTS)]


# Faults for the I/O calls of one step, in order; shrinks toward no fault at all.
faults = st.lists(st.integers(0, 999).map(_fault), max_size=3)


class SchedulerMachine(RuleBasedStateMachine):
    make_adapter: Callable[[], SchedulerAdapter] = ReferenceScheduler
    bookkeeping = True  # False: check INV-CONTENT alone (shows the bytes catch what counters miss)
    tally = Tally()

    def __init__(self) -> None:
        super().__init__()
        self.engine = type(self).make_adapter()
        self.next_request = 0
        self.injected = 0

    # --- checking -----------------------------------------------------------------------

    def _call(self, name: str, call: Callable[[], object], exiting: Sequence[RequestId] = (),
              exits: bool = False) -> None:
        """Run one scheduler call; check every property after it. `exiting`: the
        requests the call must have ended (LIVE-EXIT); `exits`: it may end or preempt
        requests of its own accord (an exception escaping it cut an exit path short)."""
        before, statuses = self.engine.state(), self.engine.statuses()
        escaped: BaseException | None = None
        try:
            call()
        except Exception as e:  # storage or swap errors must never escape the scheduler
            escaped = e
        self._count(name)
        found = self.engine.content()
        if self.bookkeeping:
            found = self._bookkeeping(name, before, statuses, exiting, exits, escaped) + found
        # bookkeeping off: the engine's own validation (a refused double free) is one of
        # the checks switched off; INV-CONTENT alone judges
        if found:
            raise PropertyViolated(name, found)

    def _bookkeeping(self, name: str, before: SchedulerState | None, statuses: Mapping[RequestId, Status],
                     exiting: Sequence[RequestId], exits: bool, escaped: BaseException | None) -> list[Violation]:
        e = self.engine
        now = e.statuses()
        found = list(e.invariants())
        after = e.state()
        if before is not None and after is not None:
            found += inv_request(after) + live_transfer(after)
            for r, s in now.items():
                if s is not statuses.get(r) and s in (*EXITED, Status.PREEMPTED):
                    found += live_exit(before, after, r)
        for r in exiting:
            if now.get(r) is Status.RUNNING:
                found.append(Violation("LIVE-EXIT", f"request {r} is still running after {name}"))
        if escaped is not None and (exiting or exits):
            found.append(Violation("LIVE-EXIT", f"{name} raised {escaped!r}: its exit path was cut short"))
        elif escaped is not None:
            found.append(Violation("VALID-INPUT", f"{name} raised {escaped!r} on a valid call"))
        live = {f"r{r}": 0 for r, s in now.items() if s not in EXITED}  # tokens: the engine observes them
        return with_observed(found, check(e.observe(), live, e.block_size) + check_tier(e.observe_cpu()))

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1
        now = self.engine.faults_injected()
        t.faults += now - self.injected
        self.injected = now

    def _running(self, i: int) -> RequestId | None:
        run = self.engine.running()
        return run[i % len(run)] if run else None

    # --- rules -----------------------------------------------------------------------------

    @rule(p=st.integers(0, len(PROMPTS) - 1), tail=st.integers(0, 3))
    def submit(self, p: int, tail: int) -> None:
        """A prompt from the shared family, then `tail` own tokens (new blocks to write)."""
        if len(self.engine.running()) + len(self.engine.waiting()) >= 5:
            return
        r = RequestId(self.next_request)
        self.next_request += 1
        tokens = PROMPTS[p] + (r % 3 + 3,) * tail
        self._call("submit", lambda: self.engine.submit(r, tokens))

    @rule(f=faults)
    def schedule(self, f: list[Fault]) -> None:
        self._call("schedule", lambda: self.engine.schedule(f), exits=True)

    @rule(picks=st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True), f=faults)
    def finish(self, picks: list[int], f: list[Fault]) -> None:
        batch = sorted({r for i in picks if (r := self._running(i)) is not None})
        if batch:
            self._call("finish", lambda: self.engine.finish(batch, f), exiting=batch)

    @rule(i=st.integers(0, 7), f=faults)
    def preempt(self, i: int, f: list[Fault]) -> None:
        r = self._running(i)
        if r is not None:
            self._call("preempt", lambda: self.engine.preempt(r, f), exiting=[r])

    @rule(i=st.integers(0, 7), f=faults)
    def abort(self, i: int, f: list[Fault]) -> None:
        live = sorted(r for r, s in self.engine.statuses().items() if s not in EXITED)
        if live:
            r = live[i % len(live)]
            self._call("abort", lambda: self.engine.abort(r, f), exiting=[r])

    @rule(n=st.integers(1, 3))
    def tick(self, n: int) -> None:
        self._call("tick", lambda: self.engine.tick(n))

    @rule(kind=st.sampled_from(SCHEDULER_LEVEL))
    def bad_input(self, kind: BadInput) -> None:
        """A bad call must raise the adapter's declared exception and change nothing."""
        error = self.engine.refusals.get(kind)
        if error is not None:
            refused(kind.value, error, lambda: self.engine.bad_call(kind), self.engine.snapshot,
                    lambda: self._made_bad_call(kind.value))

    def _made_bad_call(self, name: str) -> None:
        type(self).tally.bad_inputs += 1
        self._count(name)

    # --- LIVE-DRAIN -------------------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return
        drain(self)


def drain(m: SchedulerMachine) -> None:
    """LIVE-DRAIN: abort every request, let every transfer answer or time out, evict
    everything: all blocks free within a bounded number of ticks."""
    e = m.engine
    for r in sorted(r for r, s in e.statuses().items() if s not in EXITED):
        m._call("drain:abort", lambda: e.abort(r, ()), exiting=[r])
    bound = e.timeout + max(f.delay for f in FAULTS) + 2
    for _ in range(bound):
        m._call("drain:evict", e.evict_all)
        if not e.transfers() and _held(e) == (0, 0):
            return
        m._call("drain:tick", lambda: e.tick(1))
    gpu, cpu = _held(e)
    raise PropertyViolated("drain", [Violation(
        "LIVE-DRAIN", f"after {bound} ticks: {gpu} GPU and {cpu} CPU blocks not free, "
        f"{e.transfers()} transfers in flight")])


def _held(e: SchedulerAdapter) -> tuple[int, int]:
    """GPU and CPU blocks not free."""
    return not_free(e.observe()), not_free(e.observe_cpu())
