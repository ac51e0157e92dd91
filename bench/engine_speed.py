"""One synthetic workload through the reference cache, vLLM's KVCacheManager and SGLang's
RadixCache: microseconds per request for match, allocate and free, and each engine's
ratio to the reference. A benchmark, not a test: no asserts.

Each engine runs in its own environment (`make engines`): this script runs itself
there as a worker and prints one table. The engines are called directly, not through
the adapters, so the figures are the engines' own costs.

    python bench/engine_speed.py [--engines reference vllm sglang] [--requests N] [--live L]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workload import conversation_turns  # noqa: E402  (bench/ is on sys.path when run as a script)
from oracle.engines import ENGINES  # noqa: E402

BLOCK = 16
PHASES = ("match", "allocate", "free")


class Driver(Protocol):
    """One engine's three calls per request. A refused allocate cleans up after itself."""

    def match(self, rid: str, tokens: list[int]) -> Any: ...
    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool: ...
    def free(self, rid: str) -> None: ...


class ReferenceDriver:
    def __init__(self, blocks: int) -> None:
        from kvcache.manager import CacheManager
        from spec.hashing import block_hashes
        from spec.types import RequestId

        self.cache = CacheManager(blocks, 0)
        self.hashes = block_hashes
        self.rid = RequestId

    def match(self, rid: str, tokens: list[int]) -> Any:
        hashes = self.hashes(tokens, BLOCK)
        self.cache.match(self.rid(int(rid)), hashes, limit=0)  # the GPU prefix only: no swap-in
        return hashes

    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool:
        r = self.rid(int(rid))
        need = -(-len(tokens) // BLOCK) - len(self.cache.table(r))
        if need > self.cache.gpu.num_free:  # evict for the shortfall, as the engines do here
            self.cache.evict_gpu(need - self.cache.gpu.num_free)
        if need > self.cache.gpu.num_free:
            self.cache.release(r)  # give back the matched prefix: the request waits
            return False
        self.cache.allocate(r, need)
        self.cache.commit(r, matched[: len(tokens) // BLOCK])
        return True

    def free(self, rid: str) -> None:
        self.cache.release(self.rid(int(rid)))


class VllmDriver:
    def __init__(self, blocks: int) -> None:
        import torch  # type: ignore[import-not-found,unused-ignore]
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request

        init_none_hash(sha256)
        hasher = get_request_block_hasher(BLOCK, sha256)
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16)
        config = KVCacheConfig(num_blocks=blocks + 1, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        self.mgr = KVCacheManager(config, max_model_len=1 << 16, scheduler_block_size=BLOCK, hash_block_size=BLOCK)
        self.params = SamplingParams(max_tokens=16)
        self.new: Callable[[str, list[int]], Any] = lambda rid, t: Request(rid, t, self.params, None,
                                                                             block_hasher=hasher)
        self.requests: dict[str, Any] = {}

    def match(self, rid: str, tokens: list[int]) -> Any:
        req = self.requests[rid] = self.new(rid, tokens)  # hashing the prompt is part of matching
        return self.mgr.get_computed_blocks(req)

    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool:
        req = self.requests[rid]
        hit, hit_tokens, _ = matched
        got = self.mgr.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hit)
        if got is None:
            del self.requests[rid]
            return False
        return True

    def free(self, rid: str) -> None:
        self.mgr.free(self.requests.pop(rid))


class SglangDriver:
    def __init__(self, blocks: int) -> None:
        from oracle.engines.sglang import TORCHVISION_STANDIN

        exec(TORCHVISION_STANDIN, {})
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

        self.torch, self.evict, self.match_params, self.key = torch, EvictParams, MatchPrefixParams, RadixKey
        self.alloc = PagedTokenToKVPoolAllocator(blocks * BLOCK, BLOCK, torch.float16, "cpu", kvcache=None,
                                                 need_sort=False)
        self.rows = ReqToTokenPool(size=256, max_context_len=1 << 13, device="cpu", enable_memory_saver=False)
        self.tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.rows,
                                               token_to_kv_pool_allocator=self.alloc, page_size=BLOCK))
        self.requests: dict[str, Any] = {}

    def match(self, rid: str, tokens: list[int]) -> Any:
        from array import array
        from types import SimpleNamespace

        ids = array("q", tokens)
        m = self.tree.match_prefix(self.match_params(key=self.key(ids)))
        kv = SimpleNamespace(req_pool_idx=None, cache_protected_len=m.device_prefix_len, cache_inserted_len=0,
                             swa_evict_floor=0)
        req = SimpleNamespace(rid=rid, full_untruncated_fill_ids=ids, origin_input_ids=ids, extra_key=None,
                              cache_salt=None, priority=None, kv=kv, last_node=m.last_device_node,
                              lock=self.tree.lock(m.last_device_node))
        self.requests[rid] = req
        return m.device_prefix_len

    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool:
        req, torch = self.requests[rid], self.torch
        new = len(tokens) - matched
        pages = -(-new // BLOCK)
        short = pages * BLOCK - self.alloc.available_size()
        if short > 0:
            self.tree.evict(self.evict(num_tokens=short))
        if self.alloc.available_size() < pages * BLOCK:
            self.tree.unlock(req.lock)
            del self.requests[rid]
            return False
        row = req.kv.req_pool_idx = self.rows.alloc_rows(1)[0]
        self.rows.write((row, slice(0, matched)), self.tree.path_device_indices(req.last_node)[:matched])
        self.rows.write((row, slice(matched, len(tokens))), self.alloc.alloc(pages * BLOCK)[:new].to(torch.int32))
        return True

    def free(self, rid: str) -> None:
        req, torch = self.requests.pop(rid), self.torch
        end = len(req.full_untruncated_fill_ids)
        self.tree.checkpoint(req, up_to=end)
        self.alloc.free(self.rows.req_to_token[req.kv.req_pool_idx, req.kv.cache_protected_len:end].to(torch.int64))
        self.tree.unlock(req.lock)
        self.rows.free_rows([req.kv.req_pool_idx])


DRIVERS: dict[str, Callable[[int], Driver]] = {"reference": ReferenceDriver, "vllm": VllmDriver,
                                               "sglang": SglangDriver}


def measure(driver: Driver, prompts: Sequence[list[int]], live: int) -> dict[str, float]:
    """Admit each prompt, keeping at most `live` requests (the oldest finishes first)."""
    spent = dict.fromkeys(PHASES, 0.0)
    running: list[str] = []
    admitted = 0
    clock = time.perf_counter
    for i, tokens in enumerate(prompts):
        if len(running) >= live:
            t = clock()
            driver.free(running.pop(0))
            spent["free"] += clock() - t
        rid = str(i)
        t = clock()
        matched = driver.match(rid, tokens)
        t2 = clock()
        ok = driver.allocate(rid, tokens, matched)
        spent["match"] += t2 - t
        spent["allocate"] += clock() - t2
        if ok:
            running.append(rid)
            admitted += 1
    for rid in running:
        t = clock()
        driver.free(rid)
        spent["free"] += clock() - t
    per = {k: v * 1e6 / len(prompts) for k, v in spent.items()}
    return {**per, "admitted": admitted}


def worker(engine: str, requests: int, live: int, blocks: int, seed: int) -> dict[str, float]:
    prompts = conversation_turns(random.Random(seed), requests, BLOCK)
    return measure(DRIVERS[engine](blocks), prompts, live)


def run_engine(engine: str, a: argparse.Namespace) -> dict[str, float] | str:
    args = ["--requests", str(a.requests), "--live", str(a.live), "--blocks", str(a.blocks), "--seed", str(a.seed)]
    e = ENGINES[engine]
    if importlib.util.find_spec(e.requires) is not None:
        return worker(engine, a.requests, a.live, a.blocks, a.seed)
    python = ROOT / e.venv / "bin" / "python"
    if not e.venv or not python.exists():
        return f"not installed ({e.venv or e.requires}: make engines)"
    done = subprocess.run([str(python), __file__, "--worker", engine, *args], capture_output=True, text=True)
    if done.returncode != 0:
        return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(DRIVERS), choices=list(DRIVERS))
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--live", type=int, default=32, help="requests running at once (default 32)")
    p.add_argument("--blocks", type=int, default=1024, help="usable KV blocks of 16 tokens (default 1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", choices=list(DRIVERS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.requests, a.live, a.blocks, a.seed)))
        return
    results = {e: run_engine(e, a) for e in a.engines}
    base = results.get("reference")
    print(f"{a.requests} requests, {a.live} live, {a.blocks} blocks of {BLOCK} tokens; microseconds per request")
    print(f"{'engine':<10} {'match':>8} {'allocate':>9} {'free':>8} {'total':>8}  {'x reference (match/alloc/free/total)':<38}"
          " admitted")
    for e, r in results.items():
        if isinstance(r, str):
            print(f"{e:<10} {r}")
            continue
        total = sum(r[k] for k in PHASES)
        ratio = ""
        if isinstance(base, dict):
            btotal = sum(base[k] for k in PHASES)
            ratio = " / ".join(f"{r[k] / base[k]:.2f}" for k in PHASES) + f" / {total / btotal:.2f}"
        print(f"{e:<10} {r['match']:>8.1f} {r['allocate']:>9.1f} {r['free']:>8.1f} {total:>8.1f}  {ratio:<38} "
              f"{int(r['admitted'])}")


if __name__ == "__main__":
    main()
