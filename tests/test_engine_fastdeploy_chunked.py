"""FastDeploy's PrefixCacheManager with chunked prefill, through the adapter
oracle.engines.fastdeploy_chunked (run where `fastdeploy` imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastdeploy", reason="FastDeploy is installed from source with PaddlePaddle (docs/engines.md)")

from kvoracle.oracle.cache_machine import prompt  # noqa: E402
from kvoracle.oracle.engine import NoRoom, Op, check  # noqa: E402
from kvoracle.oracle.engine_campaign import run_engine  # noqa: E402
from kvoracle.oracle.engines import adapter_class  # noqa: E402
from kvoracle.oracle.engines.fastdeploy_chunked import FastDeployChunked  # noqa: E402
from engine_findings import assert_reproduces, reproductions  # noqa: E402

P0 = prompt(0, FastDeployChunked.block_size)  # two full blocks, A and B, and half a block


def test_registered_with_prefill() -> None:
    assert adapter_class("fastdeploy-chunked") is FastDeployChunked
    assert Op.PREFILL in FastDeployChunked.operations


def test_a_same_hash_insert_mid_prefill_detaches_a_live_node() -> None:
    """r0's first chunk caches A; r1 (the same prompt) matches A and caches B; r0's next
    chunk caches B again: update_cache_blocks (mm_build_path) replaces A's child without
    looking, and r1's node B stays in node_map, out of the tree."""
    a = FastDeployChunked()
    a.admit("r0", P0[:4])
    a.admit("r1", P0)
    assert check(a.observe(), {"r0": 4, "r1": 10}, a.block_size) == []
    a.prefill("r0", P0[4:8])
    found = check(a.observe(), {"r0": 8, "r1": 10}, a.block_size)
    assert [v.id for v in found] == ["INV-COUNTERS", "INV-COUNTERS"]
    assert a.observe().counters["node_map"] == (3, 2)
    exec("\n".join(a.script()), {})  # the calls replay as a file


def test_a_chunk_fastdeploy_would_have_matched_is_refused() -> None:
    """r1 is admitted with its first chunk while the tree holds its whole prompt: FastDeploy,
    knowing the whole prompt, would have matched the next chunk's block too, so no program
    of FastDeploy's computes it again."""
    a = FastDeployChunked()
    a.admit("r0", P0)
    a.admit("r1", P0[:4])
    script, before = a.script(), a.observe()
    with pytest.raises(NoRoom, match="FastDeploy matches"):
        a.prefill("r1", P0[4:8])
    assert a.script() == script and a.observe() == before


def test_campaign_finds_the_same_hash_overwrite(tmp_path: Path) -> None:
    row = run_engine(FastDeployChunked, False, list(range(4)), 150, 100, tmp_path)
    assert row.result.first_id == "INV-COUNTERS", row.result.violation
    assert len(row.result.counterexample) <= 5
    assert row.reproduction is not None and row.reproduces.startswith("AssertionError: INV-COUNTERS")


def test_importing_the_adapter_does_not_import_fastdeploy() -> None:
    code = "import sys, kvoracle.oracle.engines.fastdeploy_chunked; assert 'fastdeploy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("path", reproductions("fastdeploy-chunked"), ids=lambda p: p.name)
def test_documented_finding_reproduces(path: Path) -> None:
    assert_reproduces(path)
