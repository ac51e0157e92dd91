"""The resource manager's exit paths against spec/scheduler.py, and its lifecycle rules."""

from collections.abc import Callable
from dataclasses import replace

import pytest

from kvoracle.kvcache.abstraction import abstract, check_invariants
from kvoracle.kvcache.errors import (DuplicateRequest, EmptyRequest, KVCacheError, NotRunning, RequestGone,
                                     RequestTooLarge, UnknownRequest)
from kvoracle.kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, ScriptedFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import actions
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import inv_request
from kvoracle.spec.actions import Complete, PreconditionError
from kvoracle.spec.scheduler import apply, exit_request, tick
from kvoracle.spec.state import Request, Status, System
from kvoracle.spec.view import of_system
from kvoracle.spec.types import Error, OnGpu, RequestId, Timeout, TransferId

R = RequestId(0)


def manager(plan: ScriptedFaults, policy: WritePolicy = WritePolicy.ON_FINISH_AND_PREEMPT) -> ResourceManager:
    return ResourceManager(CacheManager(8, 2), FaultyStorage(MemoryStorage(), plan), FaultyCopier(plan),
                           block_size=2, write_policy=policy, timeout=3)


def running(plan: ScriptedFaults) -> ResourceManager:
    rm = manager(plan)
    rm.submit(R, [1, 1, 2, 2, 1])
    assert rm.schedule() == [R]
    return rm


def spec_state(rm: ResourceManager) -> System:
    """The abstraction of the manager (what ReferenceScheduler.state gives)."""
    requests = {r: Request(q.status, tuple(q.tokens), len(q.tokens) if q.status is Status.RUNNING else 0,
                           q.admissions) for r, q in rm.requests.items()}
    return System(abstract(rm.cache), requests, rm.block_size, rm.timeout, rm.now, dict(rm.started))


def same(a: System, b: System) -> bool:
    """Equal as refinement compares them: the cache and the requests (the clock is the checker's)."""
    return (a.cache, a.requests) == (b.cache, b.requests)


@pytest.mark.parametrize("how", ["finish", "preempt"])
def test_exit_with_a_hanging_write_refines_the_spec_action(how: str) -> None:
    plan = ScriptedFaults()
    rm = running(plan)
    before = spec_state(rm)
    writes = tuple(zip(rm.hashes(R), rm.cache.table(R)))
    plan.push(Fault(FaultKind.HANG))
    rm.finish([R]) if how == "finish" else rm.preempt(R)
    to = Status.FINISHED if how == "finish" else Status.PREEMPTED
    want = exit_request(before, R, to, writes)
    assert same(spec_state(rm), want)
    assert inv_request(of_system(want)) == [] and check_invariants(rm.cache) == []


def test_a_write_that_raises_still_releases_everything() -> None:
    plan = ScriptedFaults()
    rm = running(plan)
    before = spec_state(rm)
    writes = tuple(zip(rm.hashes(R), rm.cache.table(R)))
    plan.push(Fault(FaultKind.RAISE))
    rm.finish([R])  # FastDeploy PR 7807's bug: the raise must not skip the free
    want = exit_request(before, R, Status.FINISHED, writes)
    t = TransferId(before.cache.next_transfer)
    want = replace(want, cache=actions.complete(want.cache, t, Error()))
    assert same(spec_state(rm), want)
    assert rm.cache.gpu.num_free == 8 and rm.stats.io_raised == 1


def test_a_finish_writes_the_blocks_decode_filled_without_kv_pools_too() -> None:
    """With pools, every decode token refreshes the request's block hashes as it fills the
    block's bytes; without them (the default) nothing does: the write at finish must still
    store every full block, the ones decode filled included (24th blind run: a finish
    that wrote the hashes as last refreshed stored one block of two, in this
    configuration only). The policy is the reference's: spec/ records whatever it writes."""
    store = MemoryStorage()
    rm = ResourceManager(CacheManager(8, 2), FaultyStorage(store, ScriptedFaults()), FaultyCopier(ScriptedFaults()),
                         block_size=2, write_policy=WritePolicy.ON_FINISH, timeout=3)
    rm.submit(R, [1, 1, 2])
    for _ in range(2):  # admitted with its first decode token, then a second fills block 2
        rm.schedule()
    tokens = list(rm.requests[R].tokens)
    assert rm.pools is None and len(tokens) == 4
    rm.finish([R])
    rm.tick(1)
    assert store.exists(block_hashes(tokens, 2)) == 2


@pytest.mark.parametrize("policy, writes", [
    (WritePolicy.NONE, set()),
    (WritePolicy.ON_FINISH, {Status.FINISHED}),
    (WritePolicy.ON_FINISH_AND_PREEMPT, {Status.FINISHED, Status.PREEMPTED}),
])
def test_each_write_policy_writes_on_the_exits_it_names_and_no_other(policy: WritePolicy,
                                                                     writes: set[Status]) -> None:
    """Which exits store the request's blocks is the policy's choice, which spec/ leaves
    open (an exit may write or not): only this test holds the reference to its policy (the
    twenty-sixth blind run's ON_FINISH wrote on preemption too, and every row passed)."""
    for exit_to in (Status.FINISHED, Status.PREEMPTED, Status.ABORTED):
        store = MemoryStorage()
        rm = ResourceManager(CacheManager(8, 2), FaultyStorage(store, ScriptedFaults()),
                             FaultyCopier(ScriptedFaults()), block_size=2, write_policy=policy, timeout=3)
        rm.submit(R, [1, 1, 2, 2, 1])
        rm.schedule()
        rm.schedule()
        {Status.FINISHED: lambda: rm.finish([R]), Status.PREEMPTED: lambda: rm.preempt(R),
         Status.ABORTED: lambda: rm.abort(R)}[exit_to]()
        rm.tick(1)
        assert (len(store) > 0) == (exit_to in writes), (policy, exit_to)
        assert policy.writes_on(exit_to) == (exit_to in writes)


@pytest.mark.parametrize("gpu", [3, 4])
def test_admission_evicts_only_the_blocks_it_is_short_of(gpu: int) -> None:
    """A prompt whose first two blocks are cached on the GPU hits them and keeps them cached:
    admission evicts only what its new blocks lack in free ones (here nothing), so never
    the prefix it is about to use (its shortfall counts its GPU hits)."""
    plan = ScriptedFaults()
    rm = ResourceManager(CacheManager(gpu, 0), FaultyStorage(MemoryStorage(), plan), FaultyCopier(plan),
                         block_size=2, timeout=3)
    rm.submit(R, [1, 2, 3, 4])
    rm.schedule()
    rm.schedule()  # decodes a token: the two full blocks are now the cache's
    rm.finish([R])
    rm.tick(1)  # the write answers
    cached = sorted(n.tier.gpu for n in rm.cache.tree.walk() if isinstance(n.tier, OnGpu))
    assert len(cached) == 2 and rm.cache.gpu.num_free == gpu - 2
    hits = rm.stats.hit_blocks
    rm.submit(RequestId(1), [1, 2, 3, 4, 5])
    assert rm.schedule() == [RequestId(1)]
    assert rm.stats.hit_blocks - hits == 2 and sorted(rm.cache.table(RequestId(1))[:2]) == cached
    assert sorted(n.tier.gpu for n in rm.cache.tree.walk() if isinstance(n.tier, OnGpu)) == cached


def test_preempted_request_is_first_in_line_again() -> None:
    rm = running(ScriptedFaults())
    rm.submit(RequestId(1), [2, 2])
    rm.preempt(R)
    assert list(rm.waiting) == [R, RequestId(1)] and rm.requests[R].preemptions == 1


def test_growth_preempts_the_last_admitted_request_first() -> None:
    """The reference's policy (a choice spec/ leaves open, so no property judges it):
    when growing needs a block and nothing can be evicted, the request admitted last
    goes, so the oldest keep running (first come, first served)."""
    rm = manager(ScriptedFaults())
    first, second, last = RequestId(0), RequestId(1), RequestId(2)
    for r, token in ((first, 1), (second, 3), (last, 5)):
        rm.submit(r, [token] * 3)  # nothing shared: each holds two blocks of its own
    assert rm.schedule() == [first, second, last] and rm.cache.gpu.num_free == 2
    for _ in range(8):  # each step decodes a token: the pool is full within two
        rm.schedule()
        if any(q.preemptions for q in rm.requests.values()):
            break
    assert [rm.requests[r].preemptions for r in (first, second, last)] == [0, 0, 1]


def test_a_hung_write_times_out_and_a_late_answer_is_ignored() -> None:
    plan = ScriptedFaults()
    rm = running(plan)
    plan.push(Fault(FaultKind.LATE, delay=5))
    rm.finish([R])
    assert rm.in_flight()
    rm.tick(3)
    assert not rm.in_flight() and rm.stats.timeouts == 1
    rm.tick(2)
    assert rm.stats.stale_answers == 1 and check_invariants(rm.cache) == []
    assert rm.cache.gpu.num_free == 8 and not rm.cache.gpu_pins


@pytest.mark.parametrize("call, error", [
    (lambda rm: rm.finish([RequestId(9)]), UnknownRequest),
    (lambda rm: rm.finish([R, RequestId(9)]), UnknownRequest),  # a batch is refused whole: R keeps running
    (lambda rm: rm.abort(RequestId(9)), UnknownRequest),
    (lambda rm: rm.submit(RequestId(9), [1] * 40), RequestTooLarge),
])
def test_bad_input_changes_nothing(call: object, error: type[Exception]) -> None:
    rm = running(ScriptedFaults())
    before = spec_state(rm)
    with pytest.raises(error):
        call(rm)  # type: ignore[operator]
    assert spec_state(rm) == before


def test_finishing_twice_and_preempting_a_waiting_request_are_refused() -> None:
    rm = running(ScriptedFaults())
    rm.submit(RequestId(1), [2] * 13)  # 7 blocks with the next token: waits behind R
    rm.schedule()
    assert rm.requests[RequestId(1)].status is Status.WAITING
    rm.finish([R])
    with pytest.raises(RequestGone):
        rm.finish([R])
    with pytest.raises(NotRunning):
        rm.preempt(RequestId(1))


def test_each_refusal_names_the_request_it_refuses() -> None:
    """A bad call's error carries the offending request, for the caller to act on."""
    rm = running(ScriptedFaults())
    other, waiting = RequestId(1), RequestId(2)
    rm.submit(other, [3, 3])
    rm.schedule()
    rm.submit(waiting, [4] * 13)  # 7 blocks with the next token: waits
    rm.schedule()

    def refused(call: Callable[[], object], error: type[KVCacheError]) -> object:
        with pytest.raises(error) as e:
            call()
        return e.value.request  # type: ignore[attr-defined]

    assert refused(lambda: rm.submit(R, [1]), DuplicateRequest) == R
    assert refused(lambda: rm.submit(RequestId(9), []), EmptyRequest) == RequestId(9)
    assert refused(lambda: rm.submit(RequestId(9), [1] * 40), RequestTooLarge) == RequestId(9)
    assert refused(lambda: rm.finish([RequestId(9)]), UnknownRequest) == RequestId(9)
    assert refused(lambda: rm.abort(RequestId(9)), UnknownRequest) == RequestId(9)
    assert refused(lambda: rm.finish([R, other, other]), DuplicateRequest) == other
    assert refused(lambda: rm.preempt(waiting), NotRunning) == waiting
    rm.finish([R])
    assert refused(lambda: rm.finish([R]), RequestGone) == R
    assert refused(lambda: rm.abort(R), RequestGone) == R
    assert refused(lambda: rm.preempt(R), RequestGone) == R


def test_the_events_it_reports_replay_through_spec_to_its_own_state() -> None:
    """Refinement of the journal: every event is a step of spec/, and the replay ends
    where the manager is (with faults of every kind on the way)."""
    plan = ScriptedFaults()
    rm = manager(plan)
    model = replace(spec_state(rm), requests={})
    replayed = 0

    def call(run: Callable[[], object], ticks: int = 0) -> None:
        """The call, then its events through spec after the time it let pass (the journal
        holds no ticks: the caller's clock is spec's, as in the machines)."""
        nonlocal model, replayed
        run()
        model = tick(model, ticks)
        for event in rm.events:
            model = apply(model, event)
        replayed += len(rm.events)
        rm.events.clear()

    for i, f in enumerate((FaultKind.RAISE, FaultKind.HANG, FaultKind.ERROR)):
        for r in range(3):
            call(lambda: rm.submit(RequestId(10 * i + r), [1, 1, 2, 2, 1 + r, 3]))
        call(rm.schedule)
        plan.push(Fault(f))
        call(lambda: rm.finish(list(rm.running)[:2]))
        call(lambda: rm.tick(2), ticks=2)
        call(rm.schedule)
    assert same(model, spec_state(rm))
    assert replayed > 20


def test_a_timeout_before_its_time_is_no_step_of_spec() -> None:
    """An engine whose clock runs ahead of its caller's times transfers out early: the
    cache action takes any outcome, the system action only a timeout that is due."""
    plan = ScriptedFaults()
    rm = manager(plan)
    model = replace(spec_state(rm), requests={})
    rm.submit(RequestId(0), [1, 1, 2, 2, 3])
    rm.schedule()
    plan.push(Fault(FaultKind.HANG))
    rm.finish([RequestId(0)])  # its write hangs
    for event in rm.events:
        model = apply(model, event)
    (t,) = model.cache.transfers
    early = Complete(t, Timeout())
    for ticks in range(rm.timeout):
        with pytest.raises(PreconditionError, match=f"timed out after {ticks} ticks in flight, before its timeout"):
            apply(tick(model, ticks), early)
    assert t not in apply(tick(model, rm.timeout), early).cache.transfers
