"""The reference scheduler survives the scheduler-level stateful machine (30% fault
rate), with its KV data in numpy pools and in paddle (CPU) pools."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from oracle.scheduler_machine import SchedulerMachine


@pytest.mark.parametrize("backend", ["numpy", "paddle"])
def test_reference_scheduler(backend: str) -> None:
    if backend == "paddle":
        pytest.importorskip("paddle", reason="paddlepaddle is not installed (pip install 'kvoracle[paddle]')")
    machine = type(f"SchedulerMachine_{backend}", (SchedulerMachine,), {"kv_backend": backend})
    run_state_machine_as_test(machine, settings=settings())  # the loaded profile (fast, or deep)
