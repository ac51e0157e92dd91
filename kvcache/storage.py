"""The storage tier: blocks keyed by their chained hash, held in memory or one file each on disk.

Every read is a prefix read: a block is only useful when all the blocks before it are too,
so `read` and `exists` stop at the first block that is missing or fails its checksum.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Protocol, Sequence

from kvoracle.kvcache.errors import KVCacheError
from kvoracle.spec.types import BlockHash


class StorageError(Exception):
    """A backend call failed (raised by a backend, or injected by kvcache.faults)."""


class BadBlockHash(KVCacheError):
    """A block hash outside 64 bits: no file (and no checksum) can name it."""

    def __init__(self, h: int) -> None:
        super().__init__(f"block hash {h} is not an unsigned 64-bit integer")
        self.hash = h


class StorageBackend(Protocol):
    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        """Write `blocks` in order; return how many leading blocks were durably written."""
        ...

    def read(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        """The data of the longest leading run of `hashes` that is present and valid."""
        ...

    def exists(self, hashes: Sequence[BlockHash]) -> int:
        """Length of the longest leading run of `hashes` that is present."""
        ...


class MemoryStorage:
    def __init__(self) -> None:
        self._blocks: dict[BlockHash, bytes] = {}

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        for h, data in blocks:
            self._blocks[h] = bytes(data)  # a private copy: a caller's bytearray may change later
        return len(blocks)

    def read(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        out: list[bytes] = []
        for h in hashes:
            data = self._blocks.get(h)
            if data is None:
                break
            out.append(data)
        return out

    def exists(self, hashes: Sequence[BlockHash]) -> int:
        return len(self.read(hashes))

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, h: object) -> bool:
        return h in self._blocks


# File layout: magic, payload length (u64 LE), blake2b-16 of (hash u64 LE + payload), payload.
# The hash is inside the checksum so a file copied or renamed to another block's name is rejected.
_MAGIC = b"KVB1"
_HEADER = struct.Struct("<4sQ16s")
HEADER_SIZE = _HEADER.size  # bytes before a file's payload
_NAME = re.compile(r"[0-9a-f]{16}")
_TMP_PREFIX = ".tmp-"


def _checksum(h: BlockHash, payload: bytes) -> bytes:
    d = hashlib.blake2b(digest_size=16)
    d.update(h.to_bytes(8, "little"))
    d.update(payload)
    return d.digest()


class DirectoryStorage:
    """One file per block, replaced atomically, so a reader sees the old file, the new one, or none."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, h: BlockHash) -> Path:
        if not 0 <= h < 1 << 64:  # the file name and the checksum hold exactly 64 bits
            raise BadBlockHash(h)
        return self.root / f"{h:016x}"

    def _write_one(self, h: BlockHash, data: bytes) -> None:
        blob = _HEADER.pack(_MAGIC, len(data), _checksum(h, data)) + data
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(h))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _sync_dir(self) -> None:
        # The renames are only durable once the directory entry is on disk too (POSIX only).
        if os.name != "posix":
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        for h, _ in blocks:
            self._path(h)  # an invalid hash is the caller's bug: refuse it before writing any
        done = 0
        try:
            for h, data in blocks:
                self._write_one(h, bytes(data))
                done += 1
        except OSError:
            pass  # e.g. a full disk: report the blocks written before it as a short count
        if done:
            try:
                self._sync_dir()
            except OSError:
                return 0  # nothing is known to be durable
        return done

    def _load(self, h: BlockHash) -> bytes | None:
        """The payload of h's file, or None when it is missing, truncated or corrupt."""
        try:
            blob = self._path(h).read_bytes()
        except OSError:
            return None
        if len(blob) < _HEADER.size:
            return None
        magic, length, digest = _HEADER.unpack_from(blob)
        payload = blob[_HEADER.size :]
        if magic != _MAGIC or length != len(payload) or digest != _checksum(h, payload):
            return None
        return payload

    def read(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        out: list[bytes] = []
        for h in hashes:
            data = self._load(h)
            if data is None:
                break
            out.append(data)
        return out

    def exists(self, hashes: Sequence[BlockHash]) -> int:
        # Validates each file, so `exists` never counts a block that `read` would refuse.
        return len(self.read(hashes))

    def _block_files(self) -> list[Path]:
        return [p for p in self.root.iterdir() if _NAME.fullmatch(p.name)]

    def __len__(self) -> int:
        """The number of valid blocks (reads every file, so that it agrees with `in`)."""
        return sum(self._load(BlockHash(int(p.name, 16))) is not None for p in self._block_files())

    def __contains__(self, h: object) -> bool:
        return isinstance(h, int) and 0 <= h < 1 << 64 and self._load(BlockHash(h)) is not None
