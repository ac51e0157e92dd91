"""The reference scheduler survives the scheduler-level stateful machine (30% fault
rate), with its KV data in numpy pools and in paddle (CPU) pools."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.scheduler_machine import SchedulerMachine


@pytest.mark.parametrize("backend", ["numpy", "paddle"])
def test_reference_scheduler(backend: str) -> None:
    if backend == "paddle":
        pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install 'kvoracle[paddle]')")
    adapter = type(f"ReferenceScheduler_{backend}", (ReferenceScheduler,), {"kv_backend": backend})
    machine = type(f"SchedulerMachine_{backend}", (SchedulerMachine,), {"make_adapter": adapter})
    run_state_machine_as_test(machine, settings=settings())  # the loaded profile (fast, or deep)
