"""vLLM 0.33.0 through its adapter (run in .venv-vllm: `make test-engines`)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is installed by `make engines` in .venv-vllm")

from oracle.engine import BadInput
from oracle.engine_campaign import run_engine
from oracle.engines.vllm import VllmAdapter
from engine_findings import assert_reproduces, reproductions


def test_valid_input_keeps_every_observable_invariant(tmp_path: Path) -> None:
    row = run_engine(VllmAdapter, False, [0, 1], 150, 40, tmp_path)
    assert row.result.passed, row.result.violation
    assert row.tally.steps > 2000 and row.tally.refused > 100  # pressure: allocate_slots refused often


def test_double_free_is_found_and_reproduces(tmp_path: Path) -> None:
    row = run_engine(VllmAdapter, True, [0], 150, 40, tmp_path)
    assert row.result.first_id == "INV-REFCOUNT", row.result.violation
    assert row.reproduction is not None and row.reproduces.startswith("AssertionError: INV-REFCOUNT")


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
