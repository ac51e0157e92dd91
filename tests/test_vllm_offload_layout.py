"""The vLLM adapter's offloading layouts, picked by release (no vLLM needed: the preamble
is source text, built and compiled here, never run)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from kvoracle.oracle.engines import vllm_connector as vc
from preamble_functions import functions_of


def layout(release: tuple[int, ...]) -> str:
    row = object.__new__(vc.VllmOffload)  # no engine: only the release the texts are picked by
    row.vllm = release
    return row.offload_layout()


@pytest.mark.parametrize(("release", "texts"), [
    ((0, 15, 1), (vc.OFFLOAD_BY_REQUEST, vc.CPU_BACKEND)),
    ((0, 18, 0), (vc.OFFLOAD_BY_REQUEST, vc.CPU_BACKEND)),
    ((0, 19, 0), (vc.OFFLOAD_BY_REQUEST, vc.CPU_POLICY)),  # PR 37874: the CachePolicy tier
    ((0, 20, 2), (vc.OFFLOAD_BY_REQUEST, vc.CPU_POLICY)),
    ((0, 21, 0), (vc.OFFLOAD_BY_JOB, vc.CPU_POLICY)),  # PR 39186: jobs by id
    ((0, 26, 0), (vc.OFFLOAD_BY_JOB, vc.CPU_POLICY)),
    ((0, 29, 0), (vc.OFFLOAD_BY_JOB, vc.CPU_POLICY)),
    ((0, 34, 0), (vc.OFFLOAD_BY_JOB, vc.CPU_POLICY)),
])
def test_each_release_gets_its_transfers_and_its_cpu_tier(release: tuple[int, ...], texts: tuple[str, str]) -> None:
    assert layout(release) == "".join(texts)


@pytest.mark.parametrize("release", [(0, 18, 0), (0, 20, 2), (0, 26, 0), (0, 29, 0)])
def test_every_layout_is_python_that_defines_what_the_engine_calls(release: tuple[int, ...]) -> None:
    source = vc.OFFLOAD_PART + layout(release)
    code = compile(source, "<offload layout>", "exec")
    for name in ("take", "on_preempt", "evict_cpu"):
        assert name in code.co_names, name



def test_a_jobs_source_and_destination_are_read_from_either_shape() -> None:
    specs = functions_of(vc.OFFLOAD_BY_JOB, "specs")["specs"]
    assert specs(SimpleNamespace(req_id="r0", transfer_spec=("gpu", "cpu"))) == ("gpu", "cpu")  # 0.21 .. 0.25
    assert specs(SimpleNamespace(req_id="r0", src_spec="gpu", dst_spec="cpu")) == ("gpu", "cpu")  # 0.26+


def test_a_flushed_store_is_heard_when_its_steps_output_is_processed() -> None:
    """The worker reports a job it waited for (a flush) with the output of the step that
    flushed it; the scheduler hears of it only when it processes that output (with async
    scheduling, after it has scheduled the next step): until then the job is pending."""
    ns = functions_of(vc.WORKER, "Transfer", "Worker", Counter=Counter, KVConnectorOutput=SimpleNamespace,
                      worker_meta=dict)
    w = ns["Worker"]()
    w.now = 1
    store = w.start("store", "r1", [3, 4], key=7)
    w.wait(store)  # the step that reports r1's preemption flushes its store
    out, reported = w.report()  # the worker runs that step
    assert out.kv_connector_worker_meta == {7: 1} and reported == [store.id]
    assert w.pending() == [store]  # the output is in flight: the scheduler still counts the job
    assert w.report()[1] == []  # the next step's output does not report it again
    w.heard(reported)  # the scheduler processes the flushing step's output
    assert w.pending() == []
