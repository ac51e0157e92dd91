"""One synthetic workload through the reference cache, vLLM's KVCacheManager and SGLang's
RadixCache: microseconds per request for match, allocate and free, and each engine's
ratio to the reference. A benchmark, not a test: no asserts.

Each engine runs in its own environment (`make engines`): this script runs itself
there as a worker, one per engine, and the workers take turns, run by run (the fastest
of --repeat runs is kept), so that every engine meets the same load on a shared machine;
then it prints one table. The engines are called directly, not through the adapters, so
the figures are the engines' own costs.

    python bench/engine_speed.py [--engines reference vllm sglang] [--requests N] [--live L] [--repeat K]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workload import conversation_turns  # noqa: E402  (bench/ is on sys.path when run as a script)
from kvoracle.oracle.engines import ENGINES  # noqa: E402

BLOCK = 16
REPEAT = 5  # runs per engine; the fastest is kept (--repeat)
PHASES = ("match", "allocate", "free")


class Driver(Protocol):
    """One engine's three calls per request. A refused allocate cleans up after itself."""

    def match(self, rid: str, tokens: list[int]) -> Any: ...
    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool: ...
    def free(self, rid: str) -> None: ...


class ReferenceDriver:
    def __init__(self, blocks: int) -> None:
        from kvoracle.kvcache.manager import CacheManager
        from kvoracle.spec.hashing import block_hashes
        from kvoracle.spec.types import RequestId

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


class PreambleDriver:
    """An engine set up, and driven, by its adapter's preamble (built at the bench's size):
    its `match`, `place` and finish calls are the ones the engine machine checks."""

    def __init__(self, setup: str, finish: str) -> None:
        self.ns: dict[str, Any] = {}
        exec(setup, self.ns)
        self.finish: Callable[[Any], None] = eval(finish, self.ns)
        self.requests: dict[str, Any] = {}

    def match(self, rid: str, tokens: list[int]) -> Any:
        req = self.requests[rid] = self.ns["request"](rid, tokens)  # hashing the prompt is part of matching
        return self.ns["match"](req)

    def allocate(self, rid: str, tokens: list[int], matched: Any) -> bool:
        if self.ns["place"](self.requests[rid], matched) is None:
            del self.requests[rid]
            return False
        return True

    def free(self, rid: str) -> None:
        self.finish(self.requests.pop(rid))


def vllm_driver(blocks: int) -> Driver:
    from kvoracle.oracle.engines.vllm import manager_preamble

    return PreambleDriver(manager_preamble(BLOCK, blocks + 1, 1 << 16), "mgr.free")  # + vLLM's null block


def sglang_driver(blocks: int) -> Driver:
    from kvoracle.oracle.engines.sglang import preamble

    return PreambleDriver(preamble(BLOCK, blocks, rows=256, context=1 << 13), "finish")


DRIVERS: dict[str, Callable[[int], Driver]] = {"reference": ReferenceDriver, "vllm": vllm_driver,
                                               "sglang": sglang_driver}


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


def serve(engine: str, requests: int, live: int, blocks: int, seed: int) -> None:
    """A worker: one run on a fresh engine per line read, its figures printed as one JSON line."""
    prompts = conversation_turns(random.Random(seed), requests, BLOCK)
    for _ in sys.stdin:
        print(RESULT + json.dumps(measure(DRIVERS[engine](blocks), prompts, live)), flush=True)


RESULT = "result: "  # what marks a run's figures among whatever else an engine prints


class Worker:
    """One engine's worker process, in the environment that has the engine. Its errors go
    to a file, not a pipe: an engine that logs much would fill a pipe nobody reads and stall."""

    def __init__(self, engine: str, a: argparse.Namespace) -> None:
        e = ENGINES[engine]
        here = importlib.util.find_spec(e.requires) is not None
        python = Path(sys.executable) if here else ROOT / e.venv / "bin" / "python"
        if not python.exists():
            raise RuntimeError(f"not installed ({e.venv or e.requires}: make engines)")
        args = ["--requests", str(a.requests), "--live", str(a.live), "--blocks", str(a.blocks), "--seed", str(a.seed)]
        self.errors = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen([str(python), __file__, "--worker", engine, *args], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.errors, text=True)

    def run(self) -> dict[str, float]:
        """One run, or RuntimeError with the worker's last line of error."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write("run\n")
            stdin.flush()
        except BrokenPipeError:
            pass  # it has died: the empty read below says why
        for line in stdout:
            if line.startswith(RESULT):
                result: dict[str, float] = json.loads(line.removeprefix(RESULT))
                return result
        self.process.kill()  # its output ended: it has died
        self.process.wait()
        self.errors.seek(0)
        raise RuntimeError("failed: " + (self.errors.read().strip().splitlines() or ["?"])[-1])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.communicate()  # end of input: it exits
        self.errors.close()


def total(r: dict[str, float]) -> float:
    return sum(r[k] for k in PHASES)


def measure_engines(engines: Sequence[str], a: argparse.Namespace) -> dict[str, dict[str, float] | str]:
    """Each engine's fastest of `a.repeat` runs (by total), the engines taking turns run by
    run: on a shared machine, whose speed drifts by tens of percent within a minute, turns
    expose every engine to the same drift and the ratios stay comparable. A string says why
    an engine has no figure."""
    results: dict[str, dict[str, float] | str] = {}
    workers: dict[str, Worker] = {}
    try:
        for engine in engines:
            try:
                workers[engine] = Worker(engine, a)
            except RuntimeError as e:
                results[engine] = str(e)
        for _ in range(a.repeat):
            for engine, w in list(workers.items()):
                try:
                    run = w.run()
                except RuntimeError as e:
                    results[engine] = str(e)
                    workers.pop(engine).close()
                    continue
                best = results.get(engine)
                if not isinstance(best, dict) or total(run) < total(best):
                    results[engine] = run
    finally:
        for w in workers.values():
            w.close()
    return {engine: results[engine] for engine in engines}


def positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(DRIVERS), choices=list(DRIVERS))
    p.add_argument("--requests", type=positive, default=2000)
    p.add_argument("--live", type=positive, default=32, help="requests running at once (default 32)")
    p.add_argument("--blocks", type=positive, default=1024, help="usable KV blocks of 16 tokens (default 1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=positive, default=REPEAT,
                   help="runs per engine, each on a fresh engine, the engines taking turns; the fastest is reported "
                        f"(default {REPEAT})")
    p.add_argument("--worker", choices=list(DRIVERS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        serve(a.worker, a.requests, a.live, a.blocks, a.seed)
        return
    results = measure_engines(a.engines, a)
    base = results.get("reference")
    print(f"{a.requests} requests, {a.live} live, {a.blocks} blocks of {BLOCK} tokens; microseconds per request "
          f"(the fastest of {a.repeat} runs)")
    print(f"{'engine':<10} {'match':>8} {'allocate':>9} {'free':>8} {'total':>8}  {'x reference (match/alloc/free/total)':<38}"
          " admitted")
    for e, r in results.items():
        if isinstance(r, str):
            print(f"{e:<10} {r}")
            continue
        ratio = ""
        if isinstance(base, dict):
            ratio = " / ".join(f"{r[k] / base[k]:.2f}" for k in PHASES) + f" / {total(r) / total(base):.2f}"
        print(f"{e:<10} {r['match']:>8.1f} {r['allocate']:>9.1f} {r['free']:>8.1f} {total(r):>8.1f}  {ratio:<38} "
              f"{int(r['admitted'])}")


if __name__ == "__main__":
    main()
