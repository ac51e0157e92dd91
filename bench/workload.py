"""Replay a synthetic serving workload through the reference scheduler and print figures.

Many requests share a few system prompts, conversations come back for follow-up
turns (their history is a prefix of the next prompt), and storage write-through is
on, so prefix hits come from the GPU, the CPU tier and storage. Prints requests/s,
block operations/s and the prefix hit rate. A benchmark, not a test: no asserts.

    python bench/workload.py [--requests N] [--gpu-blocks G] [--cpu-blocks C] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from kvoracle.kvcache.faults import FaultyCopier, FaultyStorage, NoFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.state import Status
from kvoracle.spec.types import RequestId


def conversation_turns(rnd: random.Random, requests: int, block: int) -> list[list[int]]:
    """Prompts: system prompt + user text, and follow-ups that extend earlier turns."""
    systems = [[rnd.randrange(1000) for _ in range(block * rnd.randint(4, 12))] for _ in range(4)]
    history: list[list[int]] = []
    out: list[list[int]] = []
    for _ in range(requests):
        if history and rnd.random() < 0.4:
            base = rnd.choice(history)  # a follow-up turn: the whole conversation so far
        else:
            base = list(rnd.choice(systems))
        prompt = base + [rnd.randrange(1000) for _ in range(rnd.randint(4, 3 * block))]
        history.append(prompt)
        out.append(prompt)
    return out


def run(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--gpu-blocks", type=int, default=512)
    p.add_argument("--cpu-blocks", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--decode", type=int, default=24, help="tokens generated per request")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rnd = random.Random(a.seed)
    rm = ResourceManager(
        CacheManager(a.gpu_blocks, a.cpu_blocks),
        FaultyStorage(MemoryStorage(), NoFaults()),
        FaultyCopier(NoFaults()),
        block_size=a.block_size,
        write_policy=WritePolicy.ON_FINISH,
    )
    prompts = conversation_turns(rnd, a.requests, a.block_size)
    start = time.perf_counter()
    steps = 0
    for i, prompt in enumerate(prompts):
        rm.submit(RequestId(i), prompt)
    while any(q.status not in (Status.FINISHED, Status.ABORTED) for q in rm.requests.values()):
        rm.schedule()
        rm.tick()
        steps += 1
        done = [r for r in rm.running if len(rm.requests[r].tokens) - len(prompts[r]) >= a.decode]
        if done:
            rm.finish(done)
    elapsed = time.perf_counter() - start
    st = rm.stats
    print(f"requests          {a.requests} in {elapsed:.2f} s over {steps} scheduler steps")
    print(f"requests/s        {a.requests / elapsed:,.0f}")
    print(f"block ops/s       {st.block_ops / elapsed:,.0f}  ({st.block_ops} allocations, evictions and swaps)")
    print(f"prefix hit rate   {st.hit_blocks / max(1, st.prompt_blocks):.1%}  ({st.hit_blocks} of {st.prompt_blocks} full prompt blocks)")
    print(f"preemptions       {st.preempted}")


if __name__ == "__main__":
    run()
