"""The scheduler-level stateful machine: requests arrive, are scheduled, grow, are
preempted, finish and abort, while storage and swap I/O fail in every way the fault
model allows. The fault of each I/O call is a rule argument, so shrinking minimises
the faults too.

The KV data moves through real block pools (numpy, or KV_BACKEND). After every
step: every cache invariant, INV-REQUEST, LIVE-TRANSFER and INV-CONTENT; after every
exit (finish, abort, preempt, including those the scheduler makes itself): LIVE-EXIT.
Teardown: LIVE-DRAIN. Subclass and set `scheduler_class` to check a mutant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvcache.abstraction import abstract, check_invariants
from kvcache.errors import (
    DuplicateRequest,
    EmptyRequest,
    KVCacheError,
    NotRunning,
    RequestGone,
    RequestTooLarge,
    UnknownRequest,
)
from kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, ScriptedFaults
from kvcache.manager import CacheManager
from kvcache.storage import MemoryStorage
from kvcache.pool import default_backend, make_pool
from oracle.cache_machine import PROMPTS, Tally
from scheduler.content import KVPools, inv_content
from oracle.violations import PropertyViolated
from scheduler.request import WritePolicy
from scheduler.resource_manager import ResourceManager
from spec.invariants import Violation
from spec.scheduler import EXITED, SchedulerState, Status, inv_request, live_exit, live_transfer
from spec.state import CacheState
from spec.types import RequestId

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
    scheduler_class: type[ResourceManager] = ResourceManager
    cache_class: type[CacheManager] = CacheManager
    gpu_blocks = 8
    cpu_blocks = 3
    block_size = 2
    timeout = 4
    fault_rate = 0.3
    write_policy = WritePolicy.ON_FINISH_AND_PREEMPT
    kv_backend = ""  # "" : KV_BACKEND from the environment (numpy when unset)
    bookkeeping = True  # False: check INV-CONTENT alone (shows the bytes catch what counters miss)
    tally = Tally()

    def __init__(self) -> None:
        super().__init__()
        self.plan = ScriptedFaults()
        backend = self.kv_backend or default_backend()
        pools = KVPools(
            make_pool(backend, "cpu", self.gpu_blocks, self.block_size, 1, 8),
            make_pool(backend, "cpu", self.cpu_blocks, self.block_size, 1, 8),
        )
        self.rm = self.scheduler_class(
            self.cache_class(self.gpu_blocks, self.cpu_blocks),
            FaultyStorage(MemoryStorage(), self.plan),
            FaultyCopier(self.plan),
            block_size=self.block_size,
            write_policy=self.write_policy,
            timeout=self.timeout,
            pools=pools,
        )
        self.next_request = 0
        self.injected = 0

    # --- checking -----------------------------------------------------------------------

    def state(self) -> SchedulerState:
        return SchedulerState(
            abstract(self.rm.cache),
            {r: q.status for r, q in self.rm.requests.items()},
            dict(self.rm.started),
            self.rm.now,
            self.timeout,
        )

    def _call(
        self, name: str, call: Callable[[], object], faults: Sequence[Fault] = (), exiting: Sequence[RequestId] = ()
    ) -> None:
        """Run one scheduler call under `faults`; check every property after it.
        `exiting`: the requests the call must have ended (LIVE-EXIT)."""
        for f in faults:
            self.plan.push(f)
        before = self.state()
        statuses = {r: q.status for r, q in self.rm.requests.items()}
        escaped: BaseException | None = None
        try:
            call()
        except KVCacheError:
            if self.bookkeeping:
                raise
            # bookkeeping off: the reference's own validation (a refused double free) is
            # one of the checks switched off; INV-CONTENT alone judges
        except Exception as e:  # storage or swap errors must never escape the scheduler
            escaped = e
        self.plan.clear()
        self._count(name)
        found = self._content()
        if self.bookkeeping:
            found = self._bookkeeping(name, before, statuses, exiting, escaped) + found
        if found:
            raise PropertyViolated(name, found)

    def _bookkeeping(self, name: str, before: SchedulerState, statuses: dict[RequestId, Status],
                     exiting: Sequence[RequestId], escaped: BaseException | None) -> list[Violation]:
        after = self.state()
        found = check_invariants(self.rm.cache) + inv_request(after) + live_transfer(after)
        for r, q in self.rm.requests.items():
            if q.status is not statuses.get(r) and q.status in (*EXITED, Status.PREEMPTED):
                found += live_exit(before, after, r)
        for r in exiting:
            if self.rm.requests[r].status is Status.RUNNING:
                found.append(Violation("LIVE-EXIT", f"request {r} is still running after {name}"))
        if escaped is not None:
            found.append(Violation("LIVE-EXIT", f"{name} raised {escaped!r}: its exit path was cut short"))
        return found

    def _content(self) -> list[Violation]:
        rm = self.rm
        assert rm.pools is not None
        ready = [r for r in rm.running if rm.cache.ready(r)]
        return inv_content(rm.cache, rm.pools, {r: (list(rm.cache.table(r)), rm.seeds(r)) for r in ready})

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1
        now = sum(self.rm.storage.injected.values()) + sum(self.rm.copier.injected.values())
        t.faults += now - self.injected
        self.injected = now

    def _rejects(self, name: str, error: type[KVCacheError], call: Callable[[], object]) -> None:
        before: CacheState = abstract(self.rm.cache)
        statuses = {r: q.status for r, q in self.rm.requests.items()}
        type(self).tally.bad_inputs += 1
        try:
            call()
            raised: KVCacheError | None = None
        except KVCacheError as e:
            raised = e
        self._count(name)
        if not isinstance(raised, error):
            what = "accepted" if raised is None else f"raised {type(raised).__name__}"
            raise PropertyViolated(name, [Violation("BAD-INPUT", f"expected {error.__name__}, {what}")])
        if abstract(self.rm.cache) != before or {r: q.status for r, q in self.rm.requests.items()} != statuses:
            raise PropertyViolated(name, [Violation("BAD-INPUT", f"{error.__name__} raised but the state changed")])

    def _running(self, i: int) -> RequestId | None:
        run = self.rm.running
        return run[i % len(run)] if run else None

    # --- rules -----------------------------------------------------------------------------

    @rule(p=st.integers(0, len(PROMPTS) - 1), tail=st.integers(0, 3))
    def submit(self, p: int, tail: int) -> None:
        """A prompt from the shared family, then `tail` own tokens (new blocks to write)."""
        if len(self.rm.running) + len(self.rm.waiting) >= 5:
            return
        r = RequestId(self.next_request)
        self.next_request += 1
        tokens = PROMPTS[p] + (r % 3 + 3,) * tail
        self._call("submit", lambda: self.rm.submit(r, tokens))

    @rule(f=faults)
    def schedule(self, f: list[Fault]) -> None:
        self._call("schedule", self.rm.schedule, f)

    @rule(picks=st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True), f=faults)
    def finish(self, picks: list[int], f: list[Fault]) -> None:
        batch = sorted({r for i in picks if (r := self._running(i)) is not None})
        if batch:
            self._call("finish", lambda: self.rm.finish(batch), f, exiting=batch)

    @rule(i=st.integers(0, 7), f=faults)
    def preempt(self, i: int, f: list[Fault]) -> None:
        r = self._running(i)
        if r is not None:
            self._call("preempt", lambda: self.rm.preempt(r), f, exiting=[r])

    @rule(i=st.integers(0, 7), f=faults)
    def abort(self, i: int, f: list[Fault]) -> None:
        live = sorted(r for r, q in self.rm.requests.items() if q.status not in EXITED)
        if live:
            r = live[i % len(live)]
            self._call("abort", lambda: self.rm.abort(r), f, exiting=[r])

    @rule(n=st.integers(1, 3))
    def tick(self, n: int) -> None:
        self._call("tick", lambda: self.rm.tick(n))

    @rule(kind=st.sampled_from(["unknown", "finish_finished", "abort_aborted", "too_large", "duplicate_submit",
                                "empty", "preempt_waiting", "duplicate_batch"]))
    def bad_input(self, kind: str) -> None:
        rm = self.rm
        gone = {s: [r for r, q in rm.requests.items() if q.status is s] for s in Status}
        if kind == "unknown":
            self._rejects(kind, UnknownRequest, lambda: rm.finish([RequestId(10**6)]))
        elif kind == "finish_finished" and gone[Status.FINISHED]:
            r = gone[Status.FINISHED][0]
            self._rejects(kind, RequestGone, lambda: rm.finish([r]))
        elif kind == "abort_aborted" and gone[Status.ABORTED]:
            r = gone[Status.ABORTED][0]
            self._rejects(kind, RequestGone, lambda: rm.abort(r))
        elif kind == "too_large":
            self._rejects(kind, RequestTooLarge, lambda: rm.submit(RequestId(10**6), [1] * rm.cache.gpu.size * self.block_size))
        elif kind == "duplicate_submit" and rm.requests:
            r = next(iter(rm.requests))
            self._rejects(kind, DuplicateRequest, lambda: rm.submit(r, [1]))
        elif kind == "empty":
            self._rejects(kind, EmptyRequest, lambda: rm.submit(RequestId(10**6), []))
        elif kind == "preempt_waiting" and rm.waiting:
            r = rm.waiting[0]
            self._rejects(kind, NotRunning, lambda: rm.preempt(r))
        elif kind == "duplicate_batch" and rm.running:
            r = rm.running[0]
            self._rejects(kind, DuplicateRequest, lambda: rm.finish([r, r]))

    # --- LIVE-DRAIN -------------------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return
        drain(self)


def drain(m: SchedulerMachine) -> None:
    """LIVE-DRAIN: abort every request, let every transfer answer or time out, evict
    everything: all blocks free within a bounded number of ticks."""
    rm = m.rm
    for r in sorted(r for r, q in rm.requests.items() if q.status not in EXITED):
        m._call("drain:abort", lambda: rm.abort(r))
    bound = m.timeout + max(f.delay for f in FAULTS) + 2
    for _ in range(bound):
        m._call("drain:evict", lambda: (rm.cache.evict_cpu(m.cpu_blocks), rm._evict(m.gpu_blocks)))
        if not rm.in_flight() and rm.cache.gpu.num_free == m.gpu_blocks and rm.cache.cpu.num_free == m.cpu_blocks:
            return
        m._call("drain:tick", lambda: rm.tick(1))
    raise PropertyViolated("drain", [Violation(
        "LIVE-DRAIN", f"after {bound} ticks: {m.gpu_blocks - rm.cache.gpu.num_free} GPU and "
        f"{m.cpu_blocks - rm.cache.cpu.num_free} CPU blocks not free, transfers {rm.in_flight()} in flight")])
