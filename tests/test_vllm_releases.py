"""VllmAdapter's setup text is written for the installed vLLM release (0.15.1 .. 0.34.0):
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


@pytest.mark.parametrize("release, scheduler_block_size, answer", [
    ((0, 18, 0), False, TWO), ((0, 22, 1), False, TWO),  # KVCacheManager(..., hash_block_size)
    ((0, 23, 0), True, TWO), ((0, 25, 1), True, TWO),  # scheduler_block_size, a required argument
    ((0, 26, 0), True, THREE), ((0, 34, 0), True, THREE),  # get_computed_blocks' third answer
])
def test_the_setup_calls_kvcachemanager_as_each_release_takes_it(
        release: tuple[int, ...], scheduler_block_size: bool, answer: str) -> None:
    text = manager_preamble(vllm=release)
    sizes = "max_model_len=256, scheduler_block_size=4, hash_block_size=4)" if scheduler_block_size \
        else "max_model_len=256, hash_block_size=4)"
    assert f"mgr = KVCacheManager(config, {sizes}\n" in text
    assert answer in text and (TWO if answer == THREE else THREE) not in text
    compile(text, "<preamble>", "exec")


def test_the_installed_release_is_read_and_none_installed_writes_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "vllm_version", lambda: (0, 20, 2))
    assert manager_preamble() == manager_preamble(vllm=(0, 20, 2)) != manager_preamble(vllm=NEWEST)
    monkeypatch.setattr(adapter, "vllm_version", lambda: ())
    assert manager_preamble() == manager_preamble(vllm=NEWEST)


def test_both_block_pool_adapters_drive_0_15_1_to_the_newest() -> None:
    assert VllmAdapter.releases == VllmSchedulerAdapter.releases == ((0, 15, 1), NEWEST)


def test_reading_the_release_imports_no_vllm() -> None:
    probe = "import sys, kvoracle.oracle.engines.vllm; assert 'vllm' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
