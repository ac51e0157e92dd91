"""FastDeploy's PrefixCacheManager with its CPU tier, through the cache-level adapter
oracle.engines.fastdeploy_tiered (run where `fastdeploy` imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastdeploy", reason="FastDeploy is installed from source with PaddlePaddle (docs/engines.md)")

from kvoracle.oracle.cache_machine import prompt  # noqa: E402
from kvoracle.oracle.engine import BadInput, view_of  # noqa: E402
from kvoracle.oracle.engines import protocol_of  # noqa: E402
from kvoracle.oracle.engines.fastdeploy_tiered import FastDeployTiered  # noqa: E402
from kvoracle.oracle.tiered import Blocks  # noqa: E402
from kvoracle.spec import invariants  # noqa: E402
from kvoracle.spec.actions import Drop, SwapOutTo  # noqa: E402
from kvoracle.spec.hashing import block_hashes  # noqa: E402
from kvoracle.spec.invariants import Violation  # noqa: E402
from kvoracle.spec.types import Ok, RequestId  # noqa: E402
from engine_findings import assert_reproduces, reproductions  # noqa: E402

NOTHING = Blocks((), ())


def blocks(p: int) -> Blocks:
    tokens = prompt(p, FastDeployTiered.block_size)
    return Blocks(tuple(tokens), block_hashes(tokens, FastDeployTiered.block_size))


def placed(a: FastDeployTiered, r: int, p: int, chunk: int = 0) -> None:
    """The cache machine's admit: match, then the first `chunk` blocks of the rest (0: all)."""
    a.match(RequestId(r), blocks(p), 3)
    rest = -(-len(blocks(p).tokens) // a.block_size) - len(a.table(RequestId(r)))
    a.allocate(RequestId(r), rest if chunk == 0 else chunk)


def found(a: FastDeployTiered, live: dict[str, int]) -> list[Violation]:
    """What the cache machine checks: the adapter's own checks, then spec's on both tiers."""
    return a.invariants() + invariants.check(view_of(a.observe(), a.observe_cpu(), live, a.block_size))


def swapped_out(a: FastDeployTiered) -> None:
    """r0 (p=0: two full blocks and a partial one) runs and ends; its last full block goes
    to the CPU tier."""
    placed(a, 0, 0)
    a.release(RequestId(0), NOTHING)
    assert [type(s) for s in a.evict_gpu(1)] == [SwapOutTo]
    a.complete(a.in_flight()[0].transfer, Ok())


def test_a_cache_adapter_whose_swaps_end_ok() -> None:
    assert protocol_of(FastDeployTiered) == "cache"
    assert FastDeployTiered.transfer_outcomes == {"ok"}
    assert FastDeployTiered().abstract() is None


def test_a_swap_out_stays_in_flight_until_completed() -> None:
    a = FastDeployTiered()
    placed(a, 0, 0)
    a.release(RequestId(0), NOTHING)
    [step] = a.evict_gpu(1)
    assert isinstance(step, SwapOutTo) and step.cpu == 0
    [job] = a.in_flight()
    assert job.items == 1 and a.observe().pinned == frozenset({1}) and a.observe_cpu().in_flight == (0,)
    assert a.observe().evictable == () and a.evict_gpu(2) == ()  # FastDeploy evicts nothing more meanwhile
    assert found(a, {}) == []
    a.complete(job.transfer, Ok())
    assert a.in_flight() == [] and 1 in (a.observe().free or ()) and a.observe_cpu().cached == frozenset({0})
    assert found(a, {}) == []


def test_a_cpu_hit_is_swapped_in_within_match() -> None:
    a = FastDeployTiered()
    swapped_out(a)
    assert a.gpu_hits(blocks(0)) == 1
    a.match(RequestId(1), blocks(0), 3)
    assert len(a.table(RequestId(1))) == 2 and a.in_flight() == []  # the swap-in ended inside match
    assert 0 in (a.observe_cpu().free or ())
    assert found(a, {"r1": 4}) == []


def test_a_same_hash_insert_mid_prefill_detaches_a_live_node() -> None:
    """r0's first chunk caches block A; r1 (the same prompt) matches A and caches B; r0's
    next chunk caches B again: mm_build_path replaces A's child without looking, and r1's
    node B stays in node_map, detached."""
    a = FastDeployTiered()
    placed(a, 0, 0, chunk=1)
    placed(a, 1, 0)
    assert found(a, {"r0": 2, "r1": 6}) == []
    a.allocate(RequestId(0), 1)
    got = found(a, {"r0": 4, "r1": 6})
    assert {v.id for v in got} == {"INV-COUNTERS"}
    assert a.observe().counters["node_map"] == (3, 2) and a.observe().counters["node_map in tree"] == (2, 3)


def test_direct_free_eviction_strands_a_cpu_child() -> None:
    """Asked for more blocks than the CPU tier has, free_block_ids_async drops GPU leaves
    directly; a node whose child is on the CPU counts as a GPU leaf, so the child leaves the
    tree with it, and its CPU block is owned by nobody."""
    a = FastDeployTiered()
    swapped_out(a)
    assert found(a, {}) == []
    assert [type(s) for s in a.evict_gpu(4)] == [Drop]
    got = found(a, {})
    assert Violation("INV-CONSERVE", "CPU block 0 is owned by nobody") in got


@pytest.mark.parametrize("kind", sorted(FastDeployTiered.refusals, key=str), ids=str)
def test_refused_bad_calls_change_nothing(kind: BadInput) -> None:
    a = FastDeployTiered()
    placed(a, 0, 0)
    placed(a, 1, 3)
    a.release(RequestId(1), NOTHING)
    before = a.snapshot()
    with pytest.raises(FastDeployTiered.refusals[kind]):
        a.bad_call(kind, RequestId(1) if kind is BadInput.DOUBLE_FINISH else RequestId(0))
    assert a.snapshot() == before


def test_campaign_finds_the_same_hash_overwrite() -> None:
    from kvoracle.oracle.cli import run_target
    from kvoracle.oracle.targets import Target

    row = run_target(Target(FastDeployTiered.name, "cache", None, FastDeployTiered), list(range(6)), 150, 100)
    assert row.verdict == "VIOLATION" and row.first_id == "INV-COUNTERS", row.result and row.result.violation
    assert row.result is not None and len(row.result.counterexample) <= 4


def test_the_script_replays_standalone_with_a_swap_in_flight() -> None:
    a = FastDeployTiered()
    placed(a, 0, 0)
    a.release(RequestId(0), NOTHING)
    a.evict_gpu(1)
    script = "\n".join(a.script()) + "\nassert len(queue.pending) == 1\n"  # and the process still exits
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_importing_the_adapter_does_not_import_fastdeploy() -> None:
    code = "import sys, kvoracle.oracle.engines.fastdeploy_tiered; assert 'fastdeploy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("path", reproductions("fastdeploy-tiered"), ids=lambda p: p.name)
def test_documented_finding_reproduces(path: Path) -> None:
    assert_reproduces(path)
