"""What shadow mode costs per engine call, at 1,000 and 100,000 blocks, with incremental
checks and with a full check after every call. A benchmark, not a test: no asserts.

The workload is bench/engine_speed.py's (bench/workload.py's conversations: match,
allocate, free; `--live` requests at once), run three times on a fresh engine of each
size: without shadow, with shadow's incremental checks (no periodic full audit), and
with a full check after every call. The overhead per call is the difference in wall
time divided by the outermost calls shadow saw. SGLang's observer has no incremental
checks, so only its full row is printed.

Run it in each engine's environment (the engines are imported in-process):

    .venv-vllm/bin/python bench/shadow_overhead.py --engines vllm
    .venv-sglang/bin/python bench/shadow_overhead.py --engines sglang
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_speed import DRIVERS, Driver, measure  # noqa: E402
from workload import conversation_turns  # noqa: E402

from kvoracle import shadow  # noqa: E402

BLOCK = 16
SIZES = (1_000, 100_000)


def timed(engine: str, blocks: int, prompts: Sequence[list[int]], live: int,
          watch: Callable[[], shadow.Tally | None]) -> tuple[float, int]:
    """Seconds for the workload on a fresh engine, and the calls shadow saw (0: none)."""
    tally = watch()  # installed before the engine is built: attached at construction
    try:
        driver: Driver = DRIVERS[engine](blocks)
        start = time.perf_counter()
        measure(driver, prompts, live)
        spent = time.perf_counter() - start
    finally:
        shadow.uninstall(engine)
    return spent, 0 if tally is None else tally.calls


def row(engine: str, blocks: int, requests: int, full_requests: int, live: int) -> list[str]:
    prompts = conversation_turns(random.Random(0), requests, BLOCK)
    base, _ = timed(engine, blocks, prompts, live, lambda: None)
    out = [f"{engine:<7} {blocks:>8,}"]
    if engine == "vllm":
        spent, calls = timed(engine, blocks, prompts, live,
                             lambda: shadow.install(engine, mode="record", full_every=0))
        out.append(f"{(spent - base) / calls * 1e6:>12,.1f} us ({calls} calls, base {base / calls * 1e6:,.1f} us)")
    else:
        out.append(f"{'n/a (no incremental observer)':>12}")
    few = prompts[:full_requests]
    base_few, _ = timed(engine, blocks, few, live, lambda: None)
    spent, calls = timed(engine, blocks, few, live,
                         lambda: shadow.install(engine, mode="record", incremental=False, interval=1))
    out.append(f"{(spent - base_few) / calls * 1e6:>12,.1f} us ({calls} calls)")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=["vllm", "sglang"], choices=["vllm", "sglang"])
    p.add_argument("--requests", type=int, default=400, help="requests for the incremental rows (default 400)")
    p.add_argument("--full-requests", type=int, default=40,
                   help="requests for the full rows (default 40: a full check at 100,000 blocks is slow)")
    p.add_argument("--live", type=int, default=32, help="requests running at once (default 32)")
    a = p.parse_args(argv)
    print(f"shadow overhead per outermost call; blocks of {BLOCK} tokens, {a.live} live requests")
    print(f"{'engine':<7} {'blocks':>8}  {'incremental':<40} full check after every call")
    for engine in a.engines:
        if importlib.util.find_spec(engine) is None:
            print(f"{engine:<7} not importable here: run this script with {engine}'s Python")
            continue
        for blocks in SIZES:
            print("  ".join(row(engine, blocks, a.requests, a.full_requests, a.live)), flush=True)


if __name__ == "__main__":
    main()
