"""VllmAdapter's setup text is written for the installed vLLM release (0.11.2 .. 0.34.0):
the calls that moved between releases, checked without vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvoracle.oracle.engines import vllm as adapter
from kvoracle.oracle.engines.vllm import VllmAdapter, VllmSchedulerAdapter, manager_preamble
from kvoracle.oracle.engines.vllm_connector import NEWEST

TWO = "    hit, hit_tokens = mgr.get_computed_blocks(req)\n"
THREE = "    hit, hit_tokens, _ = mgr.get_computed_blocks(req)\n"


@pytest.mark.parametrize("release, sizes, answer", [
    ((0, 11, 2), "", TWO),  # KVCacheManager(config, max_model_len): no block sizes
    ((0, 12, 0), ", hash_block_size=4", TWO), ((0, 22, 1), ", hash_block_size=4", TWO),
    ((0, 23, 0), ", scheduler_block_size=4, hash_block_size=4", TWO),  # scheduler_block_size, required
    ((0, 25, 1), ", scheduler_block_size=4, hash_block_size=4", TWO),
    ((0, 26, 0), ", scheduler_block_size=4, hash_block_size=4", THREE),  # get_computed_blocks' third answer
    ((0, 34, 0), ", scheduler_block_size=4, hash_block_size=4", THREE),
])
def test_the_setup_calls_kvcachemanager_as_each_release_takes_it(
        release: tuple[int, ...], sizes: str, answer: str) -> None:
    text = manager_preamble(vllm=release)
    assert f"mgr = KVCacheManager(config, max_model_len=256{sizes})\n" in text
    assert answer in text and (TWO if answer == THREE else THREE) not in text
    compile(text, "<preamble>", "exec")


def test_the_installed_release_is_read_and_none_installed_writes_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "vllm_version", lambda: (0, 20, 2))
    assert manager_preamble() == manager_preamble(vllm=(0, 20, 2)) != manager_preamble(vllm=NEWEST)
    monkeypatch.setattr(adapter, "vllm_version", lambda: ())
    assert manager_preamble() == manager_preamble(vllm=NEWEST)


def test_both_block_pool_adapters_drive_0_11_2_to_the_newest() -> None:
    assert VllmAdapter.releases == VllmSchedulerAdapter.releases == ((0, 11, 2), NEWEST)


@pytest.mark.parametrize("release, empty", [((0, 11, 2), True), ((0, 13, 0), True), ((0, 14, 0), False), (NEWEST, False)])
def test_an_empty_table_is_left_out_only_where_a_refusal_leaves_one(
        monkeypatch: pytest.MonkeyPatch, release: tuple[int, ...], empty: bool) -> None:
    # up to 0.13.0 allocate_slots refused leaves the request an empty req_to_blocks entry
    monkeypatch.setattr(adapter, "vllm_version", lambda: release)
    adapter.installed.cache_clear()
    try:
        block = type("Block", (), {"block_id": 3})()
        tables = adapter.held_tables({"r0": [block], "r1": []})
    finally:
        adapter.installed.cache_clear()
    assert tables == ({"r0": (3,)} if empty else {"r0": (3,), "r1": ()})


def test_reading_the_release_imports_no_vllm() -> None:
    probe = "import sys, kvoracle.oracle.engines.vllm; assert 'vllm' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)


@pytest.mark.parametrize("queues", [(), ("skipped_waiting",), ("kv_holding_waiting",)])
def test_every_waiting_queue_of_a_release_is_read(queues: tuple[str, ...]) -> None:
    """A waiting request is in `waiting` or, by release, in `skipped_waiting` (a pass
    skipped it) or `kv_holding_waiting` (it holds blocks: an async KV load's): the
    scheduler adapter and the shadow observer read them all."""
    sched = type("Scheduler", (), {"waiting": ["r0"], **{name: [f"r{i + 1}"] for i, name in enumerate(queues)}})()
    assert [r for queue in adapter.waiting_queues(sched) for r in queue] == ["r0", *(f"r{i + 1}" for i in range(len(queues)))]
