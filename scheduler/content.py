"""The KV data behind the bookkeeping: which content each block must hold, and INV-CONTENT.

A block at position i of a request's table stands for the token prefix ending in
block i; its content is `seed_content(seed)`, with seed the chained hash of that
prefix (a stand-in for the K and V a prefill would compute from it). So a block's
fingerprint says which prefix it holds, and a block recycled while still listed
shows up as a wrong fingerprint even when every counter adds up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool import BlockPool, Bytes2D, content_fingerprints, seed_fingerprints
from kvoracle.spec.hashing import block_hash
from kvoracle.spec.invariants import Content, Violation, inv_content
from kvoracle.spec.types import BlockHash, OnCpu, OnGpu, SwappingIn, SwappingOut

K = TypeVar("K")


@dataclass(frozen=True)
class KVPools:
    gpu: BlockPool
    cpu: BlockPool


def block_seeds(tokens: list[int], hashes: tuple[BlockHash, ...], block_size: int, blocks: int) -> list[int]:
    """The content seed of each of a request's `blocks` table positions: the chained
    hash of its full blocks, and for a partial last block the hash of its tokens so far."""
    seeds: list[int] = list(hashes[:blocks])
    for i in range(len(seeds), blocks):
        parent = BlockHash(seeds[-1]) if seeds else None
        seeds.append(block_hash(parent, tokens[i * block_size : (i + 1) * block_size], (1,)))
    return seeds


def content(cache: CacheManager, pools: KVPools, tables: dict[int, tuple[list[int], list[int]]]) -> list[Violation]:
    """What spec's INV-CONTENT says of the reference's blocks: each block reachable through
    the tree or a ready request's table, its fingerprint and its prefix's.

    `tables` maps each ready running request to (its table, the seeds of its positions)."""
    gpu_blocks: list[int] = []
    gpu_seeds: list[int] = []
    cpu_blocks: list[int] = []
    cpu_seeds: list[int] = []
    for node in cache.tree.walk():
        t = node.tier
        if isinstance(t, OnGpu | SwappingOut):
            gpu_blocks.append(t.gpu)
            gpu_seeds.append(node.hash)
        if isinstance(t, OnCpu | SwappingIn):
            cpu_blocks.append(t.cpu)
            cpu_seeds.append(node.hash)
    for table, seeds in tables.values():
        gpu_blocks += table
        gpu_seeds += seeds
    out = _compare("GPU", pools.gpu, gpu_blocks, gpu_seeds)
    return out + _compare("CPU", pools.cpu, cpu_blocks, cpu_seeds)


def _compare(tier: str, pool: BlockPool, blocks: list[int], seeds: list[int]) -> list[Violation]:
    # a cached block a request's table holds too is reached twice: judge (and report) it once
    pairs = dict.fromkeys(zip(blocks, seeds))
    blocks, seeds = [b for b, _ in pairs], [s for _, s in pairs]
    if not blocks:
        return []
    have = _fingerprints(pool.read_rows(blocks))
    want = _wanted(seeds, pool.block_bytes)
    return inv_content([Content(tier, b, w, h) for b, h, w in zip(blocks, have, want)])


# Two memos of pure functions: a block's bytes -> their fingerprint (a campaign's blocks hold
# few distinct contents; the bytes are read afresh at every check, so nothing the pool says
# about its writes is trusted), and (seed, block bytes) -> the fingerprint of the content it
# stands for (a campaign's prompts give few seeds). Each key is computed once, up to a bound.
_SEEN: dict[bytes, int] = {}
_SEEN_BYTES = 1 << 26  # of keys
_WANTED: dict[tuple[int, int], int] = {}
_WANTED_MAX = 1 << 16


def _memoized(memo: dict[K, int], keys: list[K], compute: Callable[[list[K]], list[int]], most: int) -> list[int]:
    """compute(keys), computing only the keys `memo` lacks; a memo that would hold more than
    `most` keys is emptied first, and again after a call whose keys alone are more."""
    new = [k for k in dict.fromkeys(keys) if k not in memo]
    if new and len(memo) + len(new) > most:
        memo.clear()  # the keys seen before go with it: compute every key of this call
        new = list(dict.fromkeys(keys))
    if new:
        memo.update(zip(new, compute(new)))
    found = [memo[k] for k in keys]
    if len(memo) > most:
        memo.clear()
    return found


def _fingerprints(rows: Bytes2D) -> list[int]:
    """content_fingerprints(rows), fingerprinting only the contents not seen before (the
    reference definition every pool's own fingerprints match, on the bytes the pool holds)."""
    width = rows.shape[1]

    def computed(contents: list[bytes]) -> list[int]:
        return content_fingerprints(np.frombuffer(b"".join(contents), dtype=np.uint8).reshape(len(contents), width))

    return _memoized(_SEEN, [row.tobytes() for row in rows], computed, _SEEN_BYTES // max(1, width))


def _wanted(seeds: list[int], block_bytes: int) -> list[int]:
    """seed_fingerprints(seeds, block_bytes), computing only the seeds not seen before."""
    def computed(keys: list[tuple[int, int]]) -> list[int]:
        return seed_fingerprints([seed for seed, _ in keys], block_bytes)

    return _memoized(_WANTED, [(s, block_bytes) for s in seeds], computed, _WANTED_MAX)
