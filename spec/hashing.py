"""Chained block hashes: a full block is named by (parent hash, its tokens, extra keys).

A block's digest covers its parent's hash (8 bytes, or "-" for the first block), its
tokens, and the extra keys. Tokens are packed as little-endian 64-bit integers (tag
"q"), the whole prompt in one call, so that hashing a prompt costs one digest per block
and no text; a token outside that range makes the block's tokens decimal text instead
(tag "t"), a different encoding, so the two never name the same bytes.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Sequence, cast

from kvoracle.spec.types import BlockHash

_WIDTH = 8  # bytes per packed token
_DIGEST8 = hashlib.blake2b(digest_size=8)  # copied per block: cheaper than parsing the keyword each time


def block_hash(parent: BlockHash | None, tokens: Sequence[int], extra: Sequence[int] = ()) -> BlockHash:
    return _chained(parent, _packed(tokens), _extra_bytes(extra))


def _extra_bytes(extra: Sequence[int]) -> bytes:
    return ("x" + ",".join(map(str, extra))).encode()


def _packed(tokens: Sequence[int]) -> bytes:
    """The tokens' encoding: tag "q" and 8 bytes each, or tag "t" and decimal text."""
    raw = _int64s(tokens)
    return ("t" + ",".join(map(str, tokens))).encode() if raw is None else b"q" + raw


def _int64s(tokens: Sequence[int]) -> bytes | None:
    """The tokens as little-endian 64-bit integers, or None when one does not fit."""
    try:
        packed = array("q", tokens)
    except OverflowError:
        return None
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _chained(parent: BlockHash | None, tokens: bytes, extra: bytes) -> BlockHash:
    head = b"-" if parent is None else parent.to_bytes(8, "little")
    digest = hashlib.blake2b(head + tokens + extra, digest_size=8).digest()
    return BlockHash(int.from_bytes(digest, "little"))


def block_hashes(tokens: Sequence[int], block_size: int, extra: Sequence[int] = ()) -> tuple[BlockHash, ...]:
    """Hashes of every full block of `tokens`; a trailing partial block has none (never cached)."""
    if block_size < 1:
        raise ValueError(f"block size must be >= 1, got {block_size}")
    full = len(tokens) - len(tokens) % block_size
    if not full:
        return ()
    keys = _extra_bytes(extra)
    raw = _int64s(tokens[:full])
    if raw is not None:  # one packing, sliced per block: the hot path of match
        digests: list[int] = []
        step, head, fresh, number = block_size * _WIDTH, b"-", _DIGEST8.copy, int.from_bytes
        for start in range(0, len(raw), step):
            h = fresh()  # the same bytes, in the same order, as _chained's
            h.update(head)
            h.update(b"q")
            h.update(raw[start : start + step])
            h.update(keys)
            head = h.digest()
            digests.append(number(head, "little"))
        return cast(tuple[BlockHash, ...], tuple(digests))  # a NewType of int: one cast, not a call per block
    out: list[BlockHash] = []
    parent: BlockHash | None = None  # a token outside 64 bits: each block packed on its own
    for start in range(0, full, block_size):
        parent = _chained(parent, _packed(tokens[start : start + block_size]), keys)
        out.append(parent)
    return tuple(out)
