"""The resource manager's exit paths against spec/scheduler.py, and its lifecycle rules."""

from dataclasses import replace

import pytest

from kvoracle.kvcache.abstraction import abstract, check_invariants
from kvoracle.kvcache.errors import NotRunning, RequestGone, RequestTooLarge, UnknownRequest
from kvoracle.kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, ScriptedFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import actions
from kvoracle.spec.scheduler import SchedulerState, Status, exit_request, inv_request
from kvoracle.spec.types import Error, RequestId, TransferId

R = RequestId(0)


def manager(plan: ScriptedFaults, policy: WritePolicy = WritePolicy.ON_FINISH_AND_PREEMPT) -> ResourceManager:
    return ResourceManager(CacheManager(8, 2), FaultyStorage(MemoryStorage(), plan), FaultyCopier(plan),
                           block_size=2, write_policy=policy, timeout=3)


def running(plan: ScriptedFaults) -> ResourceManager:
    rm = manager(plan)
    rm.submit(R, [1, 1, 2, 2, 1])
    assert rm.schedule() == [R]
    return rm


def spec_state(rm: ResourceManager) -> SchedulerState:
    return SchedulerState(abstract(rm.cache), {r: q.status for r, q in rm.requests.items()}, dict(rm.started),
                          rm.now, rm.timeout)


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
    assert spec_state(rm) == want
    assert inv_request(want) == [] and check_invariants(rm.cache) == []


def test_a_write_that_raises_still_releases_everything() -> None:
    plan = ScriptedFaults()
    rm = running(plan)
    before = spec_state(rm)
    writes = tuple(zip(rm.hashes(R), rm.cache.table(R)))
    plan.push(Fault(FaultKind.RAISE))
    rm.finish([R])  # seed bug b: the raise must not skip the free
    want = exit_request(before, R, Status.FINISHED, writes)
    t = TransferId(before.cache.next_transfer)
    want = replace(want, cache=actions.complete(want.cache, t, Error()), started={})
    assert spec_state(rm) == want
    assert rm.cache.gpu.num_free == 8 and rm.stats.io_raised == 1


def test_preempted_request_is_first_in_line_again() -> None:
    rm = running(ScriptedFaults())
    rm.submit(RequestId(1), [2, 2])
    rm.preempt(R)
    assert list(rm.waiting) == [R, RequestId(1)] and rm.requests[R].preemptions == 1


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
