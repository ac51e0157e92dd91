"""vLLM through its adapters (0.34.0 in .venv-vllm: `make test-engines`; VllmAdapter and VllmSchedulerAdapter drive 0.11.2 .. 0.34.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is installed by `make engines` in .venv-vllm")

from kvoracle.oracle.engine import BadInput  # noqa: E402
from kvoracle.oracle.engine_campaign import run_engine  # noqa: E402
from kvoracle.oracle.engines.vllm import VllmAdapter, VllmSchedulerAdapter  # noqa: E402
from engine_findings import assert_reproduces, reproductions  # noqa: E402


def test_valid_input_keeps_every_observable_invariant(tmp_path: Path) -> None:
    row = run_engine(VllmAdapter, False, [0, 1], 150, 40, tmp_path)
    assert row.result.passed, row.result.violation
    assert row.tally.steps > 2000 and row.tally.refused > 100  # pressure: allocate_slots refused often


def test_double_free_is_found_and_reproduces(tmp_path: Path) -> None:
    row = run_engine(VllmAdapter, True, [0], 150, 40, tmp_path)
    assert row.result.first_id == "INV-REFCOUNT", row.result.violation
    assert row.reproduction is not None and row.reproduces.startswith("AssertionError: INV-REFCOUNT")


def test_full_scheduler_keeps_every_observable_invariant(tmp_path: Path) -> None:
    row = run_engine(VllmSchedulerAdapter, False, [0], 100, 40, tmp_path)
    assert row.result.passed, row.result.violation
    assert row.tally.steps > 1000


def test_full_scheduler_preempts_and_the_machine_follows() -> None:
    """Two requests share a prefix and decode until the pool is short: the scheduler
    preempts the later one (its blocks go back, it waits), then resumes it with prefix
    hits once the first is finished."""
    a = VllmSchedulerAdapter()
    a.admit("r0", [1] * 10)
    a.admit("r1", [1] * 8 + [2] * 2)
    for _ in range(6):
        a.grow("r0", [])
    o = a.observe()
    assert o.waiting == frozenset({"r1"}) and set(o.tables or {}) == {"r0"}
    a.finish("r0")
    a.grow("r1", [])
    o = a.observe()
    assert o.waiting == frozenset() and set(o.tables or {}) == {"r1"}


def test_second_free_of_a_request_is_tolerated() -> None:
    a = VllmAdapter()
    a.admit("r0", [1, 1, 2, 2, 1])
    a.finish("r0")
    before = a.observe()
    assert a.bad_input(BadInput.DOUBLE_FINISH, "r0")
    assert a.observe() == before


@pytest.mark.parametrize("path", reproductions("vllm"), ids=lambda p: p.name)
def test_documented_finding_reproduces(path: Path) -> None:
    assert_reproduces(path)


def test_findings_are_documented() -> None:
    assert reproductions("vllm"), "docs/findings has no vLLM reproduction"
