"""FastDeploy's PrefixCacheManager through its adapter (run where `fastdeploy` imports)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastdeploy", reason="FastDeploy is installed from source with PaddlePaddle (docs/engines.md)")

from kvoracle.oracle.engine import BadInput  # noqa: E402
from kvoracle.oracle.engine_campaign import run_engine  # noqa: E402
from kvoracle.oracle.engines.fastdeploy import FastDeployAdapter  # noqa: E402
from engine_findings import assert_reproduces, reproductions  # noqa: E402


def test_valid_input_keeps_every_observable_invariant(tmp_path: Path) -> None:
    row = run_engine(FastDeployAdapter, False, [0, 1], 150, 40, tmp_path)
    assert row.result.passed, row.result.violation
    assert row.tally.steps > 2000 and row.tally.refused > 100  # pressure: can_allocate_gpu_blocks refused often
    assert row.tally.per_rule.get("evict", 0) > 100


@pytest.mark.parametrize("kind", [BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE], ids=lambda k: k.value)
def test_unchecked_recycle_is_found_and_reproduces(kind: BadInput, tmp_path: Path) -> None:
    """recycle_gpu_blocks checks only the count of free blocks: a block already free, or
    an id past the last block, is pushed onto gpu_free_block_list."""
    class Only(FastDeployAdapter):
        bad_inputs = frozenset({kind})

    expected = "INV-TIER" if kind is BadInput.OUT_OF_RANGE else "INV-CONSERVE"  # an id past the tier, or twice
    row = run_engine(Only, True, [0], 150, 40, tmp_path)
    assert row.result.first_id == expected, row.result.violation
    assert f"bad_input:{kind.value}" in str(row.result.violation)
    assert row.reproduction is not None and row.reproduces.startswith(f"AssertionError: {expected}")


def test_second_release_of_a_request_is_refused_and_changes_nothing() -> None:
    a = FastDeployAdapter()
    a.admit("r0", [1, 1, 1, 1, 2, 2, 2, 2, 1])
    a.admit("r1", [1, 1, 1, 1, 2, 2, 2, 2, 2, 2])  # shares r0's two cached blocks
    a.finish("r0")
    before = a.observe()
    with pytest.raises(KeyError):  # release_block_ids: the request is no longer in req_leaf_map
        a.bad_input(BadInput.DOUBLE_FINISH, "r0")
    assert a.observe() == before
    exec("\n".join(a.script()), {})  # the refused call replays without stopping a reproduction


@pytest.mark.parametrize("path", reproductions("fastdeploy"), ids=lambda p: p.name)
def test_documented_finding_reproduces(path: Path) -> None:
    assert_reproduces(path)
