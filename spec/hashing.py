"""Chained block hashes: a full block is named by (parent hash, its tokens, extra keys)."""

from __future__ import annotations

import hashlib
from typing import Sequence

from kvoracle.spec.types import BlockHash


def block_hash(parent: BlockHash | None, tokens: Sequence[int], extra: Sequence[int] = ()) -> BlockHash:
    h = hashlib.blake2b(digest_size=8)
    h.update(b"-" if parent is None else parent.to_bytes(8, "little"))
    h.update(("t" + ",".join(map(str, tokens))).encode())  # one encode per block: the hot path of match
    h.update(("x" + ",".join(map(str, extra))).encode())
    return BlockHash(int.from_bytes(h.digest(), "little"))


def block_hashes(tokens: Sequence[int], block_size: int, extra: Sequence[int] = ()) -> tuple[BlockHash, ...]:
    """Hashes of every full block of `tokens`; a trailing partial block has none (never cached)."""
    out: list[BlockHash] = []
    parent: BlockHash | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start : start + block_size], extra)
        out.append(parent)
    return tuple(out)
