"""A storage tier on disk for the reference row that writes through to files
(kvcache.storage.DirectoryStorage), and what a disk does to such a tier between calls:
a block file cut short, a flipped byte, a file gone, the whole volume gone and back.

Every damage is something DirectoryStorage must survive: a read stops at the first block
it cannot validate (a short read, which the transfer protocol already handles), and a
write to a volume that is gone reports that nothing was written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DAMAGE = ("truncate", "corrupt", "delete", "unmount", "remount")
_PREFIX = "kvoracle-disk-"
_AWAY = ".away"  # where an unmounted volume's files wait for the remount


def fresh_directory() -> str:
    """An empty directory of this process's own (campaign workers never share one). The
    first call also removes those left by processes that have ended: a worker process
    exits without running exit handlers."""
    here = Path(tempfile.gettempdir())
    for old in here.glob(f"{_PREFIX}*"):
        pid = old.name.removeprefix(_PREFIX).removesuffix(_AWAY)
        if pid.isdigit() and not _alive(int(pid)):
            _remove(old)
    root = here / f"{_PREFIX}{os.getpid()}"
    _remove(root)
    _remove(root.with_name(root.name + _AWAY))
    root.mkdir()
    return str(root)


def damage(root: str | os.PathLike[str], how: str, i: int) -> None:
    """Damage the volume at `root`, or its i-th block file (modulo their number, in the
    order they were written). Damage that has nothing to act on (no block stored yet, a volume already
    gone) does nothing."""
    if how not in DAMAGE:
        raise ValueError(f"unknown damage {how!r}; known: {', '.join(DAMAGE)}")
    path = Path(root)
    away = path.with_name(path.name + _AWAY)
    if how == "unmount" and path.is_dir():
        path.rename(away)
        path.write_bytes(b"")  # a file where the directory was: every open below it fails
    elif how == "remount" and away.is_dir():
        path.unlink()
        away.rename(path)
    elif how not in ("unmount", "remount") and path.is_dir():
        # oldest first: the blocks of the prompts every request shares are written first
        blocks = sorted((p for p in path.iterdir() if not p.name.startswith(".")),  # ".tmp-": writes under way
                        key=lambda p: (p.stat().st_mtime_ns, p.name))
        if blocks:
            _damage_file(blocks[i % len(blocks)], how)


def _damage_file(block: Path, how: str) -> None:
    if how == "delete":
        block.unlink()
        return
    blob = block.read_bytes()
    if how == "truncate":
        block.write_bytes(blob[:10])  # shorter than a header
    else:
        block.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))  # the checksum no longer holds


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
