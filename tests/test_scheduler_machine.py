"""The reference scheduler survives the scheduler-level stateful machine (30% fault
rate), with its KV data in numpy pools and in paddle (CPU) pools."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.scheduler_machine import SchedulerMachine
from kvoracle.spec import liveness


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
