"""The reference behind each adapter Protocol, so that every machine checks it, and
its mutants, the way it checks any engine:

- ReferenceAdapter (here; oracle.engine, the engine machine): admit = match +
  allocate + commit of the full blocks; prefill and grow = allocate + commit (each
  chunk caches the full blocks it completes); finish = release; evict = evict_gpu (one
  tier: evicted blocks are dropped).
- ReferenceCache (reference_cache.py; oracle.tiered, the cache machine).
- ReferenceScheduler (reference_scheduler.py; oracle.serving, the scheduler machine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvoracle.kvcache.manager import CacheManager
from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted, blocks_for
from kvoracle.oracle.engines.reference_cache import gpu_observation
from kvoracle.spec.actions import Drop, SwapOutTo
from kvoracle.spec.hashing import block_hashes

GPU_BLOCKS = 6


class ReferenceAdapter(Scripted):
    name = "reference"
    block_size = 2
    operations = frozenset(Op)
    bad_inputs = frozenset({BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.DOUBLE_FINISH})
    cache_class: type[CacheManager] = CacheManager

    def __init__(self) -> None:
        self.preamble = (
            f"import {self.cache_class.__module__}\n"
            "from kvoracle.spec.hashing import block_hashes\n"
            "from kvoracle.spec.types import GpuBlock, RequestId\n"
            f"cache = {self.cache_class.__module__}.{self.cache_class.__qualname__}({GPU_BLOCKS}, 0)\n"
        )
        super().__init__()
        self.tokens: dict[str, list[int]] = {}

    @property
    def cache(self) -> CacheManager:
        c = self.namespace["cache"]
        assert isinstance(c, CacheManager)
        return c

    def _commit(self, rid: str) -> None:
        full = len(self.tokens[rid]) // self.block_size
        self.run(f"_ = cache.commit(RequestId({rid[1:]}), block_hashes({self.tokens[rid]}, {self.block_size})[:{full}])")

    def _room(self, need: Callable[[], int]) -> None:
        """Evict until `need()` blocks are free (eviction may shrink a prefix hit, so
        the need is asked again after each round)."""
        while (short := need() - self.cache.gpu.num_free) > 0:
            rep: Any = self.run(f"_ = cache.evict_gpu({short})")
            if not rep.steps:
                raise NoRoom(f"{need()} blocks needed, {self.cache.gpu.num_free} free")

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        hashes = block_hashes(tokens, self.block_size)
        self._room(lambda: blocks_for(len(tokens), self.block_size) - self.cache.gpu_hits(hashes))
        hits = self.cache.gpu_hits(hashes)
        self.tokens[rid] = list(tokens)
        r = f"RequestId({rid[1:]})"
        self.run(f"_ = cache.match({r}, block_hashes({list(tokens)}, {self.block_size}))")
        self.run(f"_ = cache.allocate({r}, {blocks_for(len(tokens), self.block_size) - hits})")
        self._commit(rid)
        return hits

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        self.grow(rid, tokens)

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        held = self.tokens[rid]
        have = blocks_for(len(held), self.block_size)
        need = blocks_for(len(held) + len(tokens), self.block_size) - have
        self._room(lambda: need)
        self.run(f"_ = cache.allocate(RequestId({rid[1:]}), {need})")
        held.extend(tokens)
        self._commit(rid)

    def finish(self, rid: str) -> None:
        self.run(f"_ = cache.release(RequestId({rid[1:]}))")
        del self.tokens[rid]

    def evict(self, blocks: int) -> int:
        rep: Any = self.run(f"_ = cache.evict_gpu({blocks})")
        return sum(1 for step in rep.steps if isinstance(step, Drop | SwapOutTo))

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        c = self.cache
        if kind is BadInput.DOUBLE_FREE and c.gpu.num_free:
            self.run_bad(f"cache.gpu.free([GpuBlock({c.gpu.free_blocks()[-1]})])")
        elif kind is BadInput.OUT_OF_RANGE:
            self.run_bad(f"cache.gpu.free([GpuBlock({c.gpu.size})])")
        elif kind is BadInput.DOUBLE_FINISH and rid is not None and rid not in self.tokens:
            self.run_bad(f"cache.release(RequestId({rid[1:]}))")
        else:
            return False
        return True

    def observe(self) -> Observation:
        return gpu_observation(self.cache)

    assertions = (
        "from kvoracle.kvcache.abstraction import check_invariants\n"
        "found = check_invariants(cache)\n"
        "assert not found, str(found[0])\n"
    )
