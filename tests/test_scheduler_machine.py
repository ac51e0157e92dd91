"""The reference scheduler survives the scheduler-level stateful machine (30% fault
rate), with its KV data in numpy pools and in paddle (CPU) pools."""

import threading

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle.engine import BadInput
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.mutants import Mutant
from kvoracle.oracle.scheduler_machine import SchedulerMachine
from kvoracle.oracle.targets import Target
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import liveness
from kvoracle.spec.state import Status
from kvoracle.spec.types import RequestId


@pytest.mark.parametrize("backend", ["numpy", "paddle"])
def test_reference_scheduler(backend: str) -> None:
    if backend == "paddle":
        pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install 'kvoracle[paddle]')")
    adapter = type(f"ReferenceScheduler_{backend}", (ReferenceScheduler,), {"kv_backend": backend})
    machine = type(f"SchedulerMachine_{backend}", (SchedulerMachine,), {"make_adapter": adapter})
    run_state_machine_as_test(machine, settings=settings())  # the loaded profile (fast, or deep)


def test_a_request_holding_the_whole_gpu_drains_within_the_bound() -> None:
    """The drain's evict_all takes only the GPU's current leaves; a leaf's parent goes a
    tick later, after its swap-out ends. A request that decoded until it held all 8 GPU
    blocks in one chain, preempted while its write hangs, needs more ticks than the
    timeout and the latest fault: the bound is spec's (a campaign found this program
    when the old bound, timeout + latest answer + 2, judged the reference leaky)."""
    m = SchedulerMachine()
    m.submit(p=0, tail=1)
    for _ in range(11):
        m.schedule(())
    assert m.engine.observe().free == ()
    m.schedule((Fault(FaultKind.HANG), Fault(FaultKind.LATE, delay=2), Fault(FaultKind.ERROR), Fault(FaultKind.HANG)))
    m.teardown()  # LIVE-DRAIN: raises PropertyViolated if a block is still held
    assert liveness.drained(m.view(), len(m.engine.transfers())) == []


class AbortForgetsFinished(ResourceManager):
    """The eighteenth blind run's plant: `abort` refuses only aborted requests, so aborting
    a finished one fails deep inside (a ValueError), not with RequestGone."""

    def abort(self, r: RequestId) -> None:
        req = self.requests.get(r)
        if req is not None and req.status is Status.FINISHED:
            raise ValueError(f"{r} is not in deque")
        super().abort(r)


def test_an_abort_that_refuses_only_aborted_requests_is_caught() -> None:
    """DOUBLE_ABORT names a finished request as well as an aborted one (by turns)."""
    plant = Mutant("abort-forgets-finished", 0, "", "", frozenset({"BAD-INPUT"}), scheduler_class=AbortForgetsFinished)
    result = run_machine(Target(plant.name, "scheduler", plant).machine(), seed_value=0, examples=75, steps=100)
    assert result.first_id == "BAD-INPUT", result.violation
    assert "expected RequestGone, raised ValueError" in str(result.violation)
    assert run_machine(Target("reference", "scheduler", None).machine(), seed_value=0, examples=75, steps=100).passed


def test_the_look_after_a_call_is_the_look_before_the_next_where_no_engine_thread_runs() -> None:
    """The machine judges the next call against the view it took after the last one
    (SchedulerMachine.settled): sound only where nothing changes the engine in between,
    so not across a bad call, made outside `_call`."""
    m = SchedulerMachine()

    def settled_is_now() -> bool:
        return m.settled == (m.view(), m.engine.statuses())

    try:
        m.submit(p=0, tail=1)
        assert settled_is_now()
        m.submit(p=1, tail=0)
        assert settled_is_now()
        m.schedule(())
        assert settled_is_now()
        m.tick(n=2, pressure=1)
        assert settled_is_now()
        m.abort(i=0, f=())
        assert settled_is_now()
        m.bad_input(kind=BadInput.UNKNOWN_REQUEST)  # made outside the path that keeps the look: looked at afresh
        assert m.settled is None
        m.tick(n=1, pressure=1)
        assert settled_is_now()
    finally:
        m.teardown()


class KeepsAWorker(ReferenceScheduler):
    """An engine with a thread of its own, which may change its state between two calls."""

    def __init__(self) -> None:
        super().__init__()
        self.stop = threading.Event()
        threading.Thread(target=self.stop.wait, name="poller", daemon=True).start()


def test_where_a_thread_of_the_engine_runs_each_call_is_looked_at_afresh() -> None:
    m = type("WithWorker", (SchedulerMachine,), {"make_adapter": KeepsAWorker})()
    try:
        m.submit(p=0, tail=1)
        m.schedule(())
        assert m.settled is None
    finally:
        m.engine.stop.set()
        m.teardown()
