"""Chained block hashes: a full block is named by (parent hash, its tokens, extra keys)."""

from __future__ import annotations

import hashlib
from typing import Sequence

from kvoracle.spec.types import BlockHash


def block_hash(parent: BlockHash | None, tokens: Sequence[int], extra: Sequence[int] = ()) -> BlockHash:
    return _chained(parent, tokens, _extra_bytes(extra))


def _extra_bytes(extra: Sequence[int]) -> bytes:
    return ("x" + ",".join(map(str, extra))).encode()


def _chained(parent: BlockHash | None, tokens: Sequence[int], extra: bytes) -> BlockHash:
    """The digest of parent, tokens and extra keys, each encoded once (the hot path of match)."""
    head = b"-" if parent is None else parent.to_bytes(8, "little")
    digest = hashlib.blake2b(head + ("t" + ",".join(map(str, tokens))).encode() + extra, digest_size=8).digest()
    return BlockHash(int.from_bytes(digest, "little"))


def block_hashes(tokens: Sequence[int], block_size: int, extra: Sequence[int] = ()) -> tuple[BlockHash, ...]:
    """Hashes of every full block of `tokens`; a trailing partial block has none (never cached)."""
    out: list[BlockHash] = []
    parent: BlockHash | None = None
    keys = _extra_bytes(extra)
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = _chained(parent, tokens[start : start + block_size], keys)
        out.append(parent)
    return tuple(out)
