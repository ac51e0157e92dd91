"""vLLM's Scheduler with a KV connector kvoracle controls (oracle.engines.vllm_connector),
through the scheduler machine. The campaigns run where vLLM 0.28.0 .. 0.34.0 is installed
(.venv-vllm: `make test-engines`, or a .venv-hunt environment); elsewhere they skip."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
from pathlib import Path

import pytest

from kvoracle.kvcache.faults import FaultKind
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.engines import protocol_of
from kvoracle.oracle.engine import view_of
from kvoracle.oracle.engines import vllm_connector as vc
from kvoracle.oracle.targets import Target
from kvoracle.oracle.violations import Baseline
from kvoracle.spec.invariants import inv_heap_sound
from kvoracle.spec.types import RequestId

ROWS = [vc.VllmConnector, vc.MooncakePreemptStore, vc.AbortDuringLoad, vc.AsyncConsumerFree, vc.IdleDelayedFree,
        vc.AbortLoadNeverAnswers, vc.FinishedRaises, vc.OffloadPrepareStoreEvicts, vc.VllmOffload,
        vc.OffloadEvictsParentOfStore, vc.OffloadAbortQueued]

installed = vc.vllm_version()
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not (0, 28, 0) <= installed <= vc.NEWEST,
    reason="vLLM 0.28.0 .. 0.34.0 (`make engines` installs 0.34.0 in .venv-vllm)")
needs_offload_jobs = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or not (0, 29, 0) <= installed <= vc.NEWEST,
    reason="the offloading connector's job layout: vLLM 0.29.0 .. 0.34.0")


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_each_row_is_a_scheduler_adapter_that_declares_its_fault_kinds(row: type[vc.VllmConnector]) -> None:
    assert protocol_of(row) == "scheduler"
    assert row.fault_kinds and FaultKind.OK not in row.fault_kinds
    assert row.fault_kinds <= vc.ALL_KINDS


def test_the_default_row_suffers_every_fault_kind_and_the_rows_steer_away_from_each_other() -> None:
    assert vc.VllmConnector.fault_kinds == frozenset(FaultKind) - {FaultKind.OK}
    # a fixed release of these rows still waits forever for a transfer that never answers
    for row in (vc.MooncakePreemptStore, vc.AbortDuringLoad, vc.AsyncConsumerFree, vc.IdleDelayedFree,
                vc.OffloadPrepareStoreEvicts):
        assert FaultKind.HANG not in row.fault_kinds and FaultKind.RAISE not in row.fault_kinds
    assert vc.AbortLoadNeverAnswers.fault_kinds == {FaultKind.HANG}
    assert vc.FinishedRaises.fault_kinds == {FaultKind.RAISE}


def test_a_call_the_engine_raised_in_raises_again_where_a_reproduction_replays_it() -> None:
    """The preamble's calls hand back what the engine raised; the recorded statement raises
    it again, so a reproduction whose last call raised (VALID-INPUT) fails there, as the
    campaign did, rather than running on past it (no vLLM needed: the namespace stands in)."""
    adapter = object.__new__(vc.VllmConnector)
    crash = AssertionError("_build_store_jobs")
    adapter.lines, adapter.namespace = [], {"step": lambda faults: crash, "tick": lambda n: None}
    adapter.tick(1)  # a call that raised nothing runs on
    with pytest.raises(AssertionError) as raised:
        adapter.schedule([])
    assert raised.value is crash
    replay: dict[str, object] = {"step": lambda faults: crash, "tick": lambda n: None}
    exec(adapter.lines[0], replay)
    with pytest.raises(AssertionError):
        exec(adapter.lines[1], replay)  # the script, run on its own, stops where the campaign did


def test_engines_writing_the_tiny_model_never_show_each_other_half_a_config(tmp_path: Path) -> None:
    # Campaigns side by side share the tiny model's folder: each engine writes the config as
    # it starts, while another may be reading it (a half-written one broke engine builds).
    folder = tmp_path / "kvoracle-tiny-llama"
    stop, seen, broken = threading.Event(), [0], []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads((folder / "config.json").read_text())
                seen[0] += 1
            except FileNotFoundError:
                pass
            except ValueError as e:
                broken.append(e)

    code = compile(vc.CPU_ENGINE, "<CPU_ENGINE>", "exec")
    before, tempfile.tempdir = tempfile.tempdir, str(tmp_path)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(300):
            exec(code, {"json": json, "os": os, "tempfile": tempfile})
    finally:
        stop.set()
        reader.join()
        tempfile.tempdir = before
    assert seen[0] > 0 and broken == []
    assert [p.name for p in folder.iterdir()] == ["config.json"]


def test_importing_the_adapter_does_not_import_vllm() -> None:
    import subprocess
    import sys

    code = "import sys, kvoracle.oracle.engines.vllm_connector; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@needs_vllm
def test_a_short_campaign_of_the_default_row_reaches_loads_and_stores() -> None:
    """Every fault kind: a store job that never answers keeps its blocks referenced for
    good (vLLM's scheduler times no connector transfer out), which is the known finding;
    past it, no property is violated."""
    target = Target(vc.VllmConnector.name, "scheduler", None, vc.VllmConnector)
    row = run_target(target, [0, 1, 2], 40, 40, Baseline.parse(["LIVE-TRANSFER"]))
    assert row.result is None, row.result.violation
    assert row.steps > 900 and row.faults > 0
    assert row.outcomes.get("ok", 0) > 50 and row.outcomes.get("error", 0) + row.outcomes.get("partial", 0) > 0


@needs_vllm
def test_an_abort_during_a_load_keeps_its_blocks_until_the_load_answers() -> None:
    """0.16.0 on (PR 32255): the destination of an aborted request's load is owned by the
    load, not freed, until its finished_recving; then the pool drains."""
    a = vc.AbortDuringLoad()
    a.submit(RequestId(0), [1] * 9)
    a.schedule([])  # the load of 8 tokens (2 blocks) starts: WAITING_FOR_REMOTE_KVS
    load = a.observe().tables or {}
    assert set(load) == {"r0"} and len(a.transfers()) == 1
    a.abort(RequestId(0), [])
    o = a.observe()
    assert not o.tables and set(o.in_flight or ()) == set(load["r0"]) == set(o.pinned or ())
    a.tick(1)  # the load answers: the blocks go back
    a.evict_all()
    o = a.observe()
    assert not a.transfers() and len(o.free or ()) == len(o.ids)
    assert a.outcomes() == {"ok": 1}


@needs_offload_jobs
def test_a_short_campaign_of_the_offload_row_passes_past_its_two_known_findings() -> None:
    """vLLM's CPU offloading tier in its job layout: stores, loads, flushes and preemptions
    under every fault kind; a store that never answers (LIVE-TRANSFER) and a CPU chunk
    left without its prefix (INV-HEAP-SOUND) are the known findings, nothing else."""
    target = Target(vc.VllmOffload.name, "scheduler", None, vc.VllmOffload)
    row = run_target(target, [0, 1], 30, 40, Baseline.parse(["LIVE-TRANSFER", "INV-HEAP-SOUND"]))
    assert row.result is None, row.result.violation
    assert row.faults > 0 and row.outcomes.get("ok", 0) > 20


@needs_offload_jobs
def test_the_offload_row_catches_a_cpu_chunk_left_without_its_prefix() -> None:
    """The shrunk finding: r1's store of its third block (parent: r0's second) is still
    being written when r2's store, on the next step, needs room; prepare_store evicts the
    idle parent, and the third block stays on the CPU tier where no lookup reaches it."""
    a = vc.VllmOffload()
    a.submit(RequestId(0), [1, 1, 1, 1, 2, 2, 2, 2, 1, 1])
    a.schedule([])  # r0's two blocks are stored
    a.submit(RequestId(1), [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 4, 4])
    a.submit(RequestId(2), [1, 1, 1, 1, 2, 2, 1, 1, 5, 5, 5, 5])
    a.schedule([])  # r1's third block is being stored; r2's two find no room
    assert inv_heap_sound(view_of(a.observe(), a.observe_cpu())) == []
    for r in (0, 1, 2):
        a.abort(RequestId(r), [])
    a.evict_all()
    a.tick(1)  # r2's stores evict r0's second block, the parent of the one in flight
    found = inv_heap_sound(view_of(a.observe(), a.observe_cpu()))
    assert [v.id for v in found] == ["INV-HEAP-SOUND"] and "CPU eviction holds node" in found[0].message
