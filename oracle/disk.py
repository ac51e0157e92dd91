"""A storage tier on disk for the reference row that writes through to files
(kvcache.storage.DirectoryStorage), and what a disk does to such a tier between calls:
a block file cut short, a flipped byte, a file gone, another block's file in its place
(a copy or a restored backup under the wrong name), the block stored anew by another
deployment sharing the volume whose blocks have another size (another block size or KV
dtype: a valid file under its own name, whose payload fits no block here), the whole
volume gone and back.

Every damage is something the reference must survive: a read stops at the first block
DirectoryStorage cannot validate (a short read, which the transfer protocol already
handles), a payload of the wrong size is not copied into a block but computed again,
and a write to a volume that is gone reports that nothing was written. What a write reports
is checked at once, before any damage: each block it counts reads back as written.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from kvoracle.kvcache.storage import DirectoryStorage
from kvoracle.spec.invariants import Content, Violation, inv_content
from kvoracle.spec.types import BlockHash

DAMAGE = ("truncate", "corrupt", "delete", "misplace", "unmount", "remount", "resize")
_AWAY = ".away"  # where an unmounted volume's files wait for the remount


class Disk:
    """A DirectoryStorage (or a subclass, `make`) in a temporary directory of its own,
    removed when the Disk is dropped. It notes the blocks written through it in the
    order they were first written, so that damage names a block by that order: the
    blocks of the prompts every request shares come first, and the choice does not
    depend on the file system's clock."""

    def __init__(self, make: Callable[[str], DirectoryStorage] = DirectoryStorage) -> None:
        root = Path(tempfile.mkdtemp(prefix="kvoracle-disk-"))
        self.backend = make(str(root))
        self.written: dict[BlockHash, None] = {}  # in the order first written (a dict keeps it)
        self.unfaithful: list[Violation] = []  # what `taken` reports next
        weakref.finalize(self, _remove, root, root.with_name(root.name + _AWAY))

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        done = self.backend.write(blocks)
        self.written.update(dict.fromkeys(h for h, _ in blocks[:done]))
        self.unfaithful += _read_back(self.backend, blocks[:done])
        return done

    def taken(self) -> list[Violation]:
        """INV-CONTENT on the storage tier: each block a write since the last call reported
        as written, read back at once (no damage comes within a call), holds what was
        written. A disk may lose a block later; a write may not report one it never wrote."""
        found, self.unfaithful = self.unfaithful, []
        return found

    def read(self, hashes: Sequence[BlockHash]) -> list[bytes]:
        return self.backend.read(hashes)

    def exists(self, hashes: Sequence[BlockHash]) -> int:
        return self.backend.exists(hashes)

    def damage(self, how: str, i: int) -> None:
        """Damage the volume, or the i-th block written (modulo their number). Damage
        that has nothing to act on (no block written yet, a volume already gone or
        already back) does nothing."""
        if how not in DAMAGE:
            raise ValueError(f"unknown damage {how!r}; known: {', '.join(DAMAGE)}")
        root = self.backend.root
        away = root.with_name(root.name + _AWAY)
        if how == "unmount" and root.is_dir():
            root.rename(away)
            root.write_bytes(b"")  # a file where the directory was: every open below it fails
        elif how == "remount" and away.is_dir():
            root.unlink(missing_ok=True)
            away.rename(root)
        elif how not in ("unmount", "remount") and self.written and root.is_dir():
            names = list(self.written)
            h = names[i % len(names)]
            if how == "misplace":  # the block before it in that order: its file, valid under its own name
                _misplace(self.backend._path(names[(i - 1) % len(names)]), self.backend._path(h))
            elif how == "resize":  # written through the storage's own API, as the other deployment would
                self.backend.write([(h, _resized(self.backend, h))])
            else:
                _damage_file(self.backend._path(h), how)


def _read_back(backend: DirectoryStorage, blocks: Sequence[tuple[BlockHash, bytes]]) -> list[Violation]:
    got = backend.read([h for h, _ in blocks])  # the longest leading run present and valid
    got += [b""] * (len(blocks) - len(got))  # a block reported written but absent reads as nothing
    return inv_content([Content("storage", h, _fingerprint(data), _fingerprint(have))
                        for (h, data), have in zip(blocks, got)])


def _fingerprint(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _damage_file(block: Path, how: str) -> None:
    if not block.is_file():
        return  # deleted before
    if how == "delete":
        block.unlink()
        return
    blob = block.read_bytes()
    if how == "truncate":
        block.write_bytes(blob[:10])  # shorter than a header
    elif blob:
        block.write_bytes(blob[:-1] + bytes([(blob[-1] + 1) % 256]))  # the checksum no longer holds


def _resized(backend: DirectoryStorage, h: BlockHash) -> bytes:
    """A payload of another size than the block's: its own with a byte more (one byte when
    it cannot be read)."""
    have = backend.read([h])
    return (have[0] if have else b"") + b"\x00"


def _misplace(source: Path, block: Path) -> None:
    if source != block and source.is_file():
        block.write_bytes(source.read_bytes())


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
