"""SGLang 0.5.23's RadixCache and paged allocator through the adapter (run in
.venv-sglang: `make test-engines`)."""

from __future__ import annotations

from pathlib import Path

import importlib.util

import pytest

if importlib.util.find_spec("sglang") is None:  # not imported here: importing it fails on a CPU machine
    pytest.skip("SGLang is installed by `make engines` in .venv-sglang", allow_module_level=True)

from kvoracle.oracle.engines.sglang import STANDIN  # noqa: E402

exec(STANDIN, {})  # what a CPU machine cannot load (tried: 0.5.15 to 0.5.22 import torchvision as sglang loads)

from engine_findings import assert_reproduces, reproductions  # noqa: E402
from kvoracle.oracle.engine import BadInput  # noqa: E402
from kvoracle.oracle.engine_campaign import restricted, run_engine  # noqa: E402
from kvoracle.oracle.engines.sglang import SglangAdapter  # noqa: E402


def test_valid_input_keeps_every_observable_invariant(tmp_path: Path) -> None:
    row = run_engine(SglangAdapter, False, [0, 1], 150, 40, tmp_path)
    assert row.result.passed, row.result.violation
    assert row.tally.steps > 2000 and row.tally.refused > 100
    assert {"admit", "grow", "finish", "evict"} <= set(row.tally.per_rule)


@pytest.mark.parametrize("kind, first_id", [
    (BadInput.DOUBLE_FREE, "INV-CONSERVE"),  # the freed page is listed twice; more free slots than capacity
    (BadInput.OUT_OF_RANGE, "INV-TIER"),  # a page past the pool joins the free list
    (BadInput.DOUBLE_UNLOCK, "INV-REFCOUNT"),  # the lock another request holds is dropped: evictable
])
def test_bad_input_is_found_and_reproduces(kind: BadInput, first_id: str, tmp_path: Path) -> None:
    row = run_engine(restricted(SglangAdapter, kind), True, [0], 300, 40, tmp_path)
    assert row.result.first_id == first_id, row.result.violation
    assert row.reproduction is not None and row.reproduces.startswith(f"AssertionError: {first_id}"), row.reproduces


@pytest.mark.parametrize("path", reproductions("sglang"), ids=lambda p: p.name)
def test_documented_finding_reproduces(path: Path) -> None:
    assert_reproduces(path)


def test_findings_are_documented() -> None:
    assert len(reproductions("sglang")) >= 3, "docs/findings should hold the three SGLang reproductions"
