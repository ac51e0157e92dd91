"""The storage tier on disk under the scheduler machine: the damage a disk does
(oracle.disk), the reference surviving it, and a storage tier that trusts its files
caught by it."""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvoracle.kvcache import storage as storage_module
from kvoracle.kvcache.storage import HEADER_SIZE, DirectoryStorage
from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.campaign import run_seeds
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.disk import DAMAGE, Disk
from kvoracle.oracle.engines.reference_scheduler import ReferenceSchedulerOnDisk
from kvoracle.oracle.scheduler_machine import DiskMachine, scheduler_level_machine
from kvoracle.oracle.targets import Target
from kvoracle.oracle.violations import PropertyViolated
from kvoracle.spec.types import BlockHash

H = [BlockHash(0xFFFF_0000 - i) for i in range(3)]  # names sort against the order written
BLOCKS = [(h, bytes([i + 1]) * 40) for i, h in enumerate(H)]


def written() -> Disk:
    disk = Disk()
    assert disk.write(BLOCKS[:2]) == 2 and disk.write(BLOCKS) == 3
    return disk


@pytest.mark.parametrize("how", ["truncate", "corrupt", "delete", "misplace"])
def test_a_damaged_block_ends_the_prefix_read_there(how: str) -> None:
    disk = written()
    disk.damage(how, 1)  # the second block first written: H[1]
    assert disk.read(H) == [BLOCKS[0][1]]
    assert disk.exists(H) == 1 and H[1] not in disk.backend and len(disk.backend) == 2
    disk.damage(how, 1)  # again: a deleted file stays deleted, a damaged one damaged
    assert disk.read(H) == [BLOCKS[0][1]]


def test_a_block_stored_anew_in_another_layout_reads_back_valid_and_of_another_size() -> None:
    """What DirectoryStorage cannot tell from a good block: the reference must (the
    mutant kept-wrong-size is the reference that does not)."""
    disk = written()
    disk.damage("resize", 1)
    got = disk.read(H)
    assert len(got) == 3 and got[0] == BLOCKS[0][1] and got[2] == BLOCKS[2][1]
    assert len(got[1]) != len(BLOCKS[1][1])
    disk.damage("delete", 1)
    disk.damage("resize", 1)  # a block the volume lost can be stored anew too
    assert len(disk.read(H)) == 3 and len(disk.read(H)[1]) == 1


def test_an_unmounted_volume_writes_and_reads_nothing_until_it_is_back() -> None:
    disk = written()
    disk.damage("unmount", 0)
    assert disk.read(H) == [] and disk.write(BLOCKS) == 0
    disk.damage("corrupt", 0)  # nothing to act on while it is gone
    disk.damage("unmount", 0)  # already gone: nothing more happens
    disk.damage("remount", 0)
    assert disk.read(H) == [data for _, data in BLOCKS]
    disk.damage("remount", 0)  # already back: nothing happens
    assert disk.exists(H) == 3


def test_damage_with_nothing_to_act_on_does_nothing() -> None:
    disk = Disk()
    for how in DAMAGE:
        disk.damage(how, 5)
    assert disk.backend.root.is_dir() and not list(disk.backend.root.iterdir())


def test_unknown_damage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown damage 'melt'"):
        Disk().damage("melt", 0)


def test_a_dropped_disk_leaves_no_directory_behind() -> None:
    disk = written()
    disk.damage("unmount", 0)
    root = disk.backend.root
    del disk
    gc.collect()
    assert not root.exists() and not root.with_name(root.name + ".away").exists()


def campaign(adapter: type[ReferenceSchedulerOnDisk], examples: int) -> tuple[str, Tally]:
    tally = Tally()
    machine = type(f"Machine_{adapter.__name__}", (scheduler_level_machine(adapter),), {"make_adapter": adapter, "tally": tally})
    assert issubclass(machine, DiskMachine)
    result = run_seeds(machine, [0], examples=examples, steps=100)
    return ("pass" if result.passed else result.first_id), tally


def test_the_reference_on_disk_survives_the_damage() -> None:
    verdict, tally = campaign(ReferenceSchedulerOnDisk, 30)
    assert verdict == "pass"
    assert tally.per_rule.get("damage", 0) > 0 and tally.outcomes.get("partial", 0) > 0


class TrustingStorage(DirectoryStorage):
    """A planted bug: the files are read back without their checksums (a truncated
    file, shorter than its header, still reads as nothing)."""

    def _load(self, h: BlockHash) -> bytes | None:
        try:
            blob = self._path(h).read_bytes()
        except OSError:
            return None
        return blob[HEADER_SIZE:] if len(blob) >= HEADER_SIZE else None


class TrustingOnDisk(ReferenceSchedulerOnDisk):
    storage = "Disk(TrustingStorage)"

    def given(self) -> dict[str, object]:
        return {**super().given(), "TrustingStorage": TrustingStorage}


def damaged_then_read(adapter: type[ReferenceSchedulerOnDisk], how: str = "corrupt") -> str:
    """A request's blocks are written to disk, one is damaged (`how`), the cache gives up
    everything, and the same prompt comes back: its prefix is read from the disk. The
    first violated ID, or "pass"."""
    m = type(f"Machine_{adapter.__name__}", (scheduler_level_machine(adapter),), {"make_adapter": adapter, "tally": Tally()})()
    try:
        m.submit(p=0, tail=0)
        m.schedule(f=())
        m.finish(picks=[0], f=())
        m.damage(how=how, i=0)
        m.tick(n=1, pressure=0)  # pressure: every block leaves the GPU and the CPU tier
        m.submit(p=0, tail=0)
        m.schedule(f=())
        m.tick(n=1, pressure=1)
        m.schedule(f=())
    except PropertyViolated as e:
        return e.violations[0].id
    return "pass"


def test_a_storage_tier_that_trusts_its_files_is_caught() -> None:
    """Corrupt bytes read back into a request's blocks: INV-CONTENT (the bytes no
    longer match the request's tokens); the reference reads around the damage. A
    campaign finds it when its draws read a damaged block back: the seeds 1 and 2 of
    0..5 (150 programs each) did when this was written (docs/mutation.md)."""
    assert damaged_then_read(ReferenceSchedulerOnDisk) == "pass"
    assert damaged_then_read(TrustingOnDisk) == "INV-CONTENT"


def _checksum_without_hash(h: BlockHash, payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class HashBlindStorage(DirectoryStorage):
    """A planted bug (the fifth blind run's): the checksum covers the payload but not the
    block's hash, so another block's file under this block's name reads as valid."""

    def _write_one(self, h: BlockHash, data: bytes) -> None:
        with patched_checksum():
            super()._write_one(h, data)

    def _load(self, h: BlockHash) -> bytes | None:
        with patched_checksum():
            return super()._load(h)


@contextmanager
def patched_checksum() -> Iterator[None]:
    saved = storage_module._checksum
    storage_module._checksum = _checksum_without_hash
    try:
        yield
    finally:
        storage_module._checksum = saved


class HashBlindOnDisk(ReferenceSchedulerOnDisk):
    storage = "Disk(HashBlindStorage)"

    def given(self) -> dict[str, object]:
        return {**super().given(), "HashBlindStorage": HashBlindStorage}


def test_a_storage_tier_whose_checksum_leaves_out_the_hash_is_caught() -> None:
    """Block 0's file replaced by another block's: the reference reads it as absent, the
    planted bug serves the other block's bytes (INV-CONTENT)."""
    assert damaged_then_read(ReferenceSchedulerOnDisk, "misplace") == "pass"
    assert damaged_then_read(HashBlindOnDisk, "misplace") == "INV-CONTENT"


class OverReportingStorage(DirectoryStorage):
    """A planted bug (the sixth blind run's): a write counts each block before writing it,
    so a write that fails part-way (the volume gone) reports one block it never wrote,
    and the cache records that block as stored."""

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        done = 0
        try:
            for h, data in blocks:
                done += 1
                self._write_one(h, bytes(data))
        except OSError:
            pass
        if done:
            self._sync_dir()
        return done


def test_a_write_that_reports_a_block_it_never_wrote_is_caught() -> None:
    disk = Disk(OverReportingStorage)
    disk.damage("unmount", 0)
    assert disk.write([(BlockHash(1), b"kv of block 1")]) == 1  # the lie
    [found] = disk.taken()
    assert found.id == "INV-CONTENT" and "storage block" in found.message
    assert disk.taken() == []  # reported once
    honest = Disk()
    honest.damage("unmount", 0)
    assert honest.write([(BlockHash(1), b"kv of block 1")]) == 0 and honest.taken() == []


class OverReportingOnDisk(ReferenceSchedulerOnDisk):
    storage = "Disk(OverReportingStorage)"

    def given(self) -> dict[str, object]:
        return {**super().given(), "OverReportingStorage": OverReportingStorage}


def test_the_scheduler_machine_catches_a_storage_tier_that_over_reports_its_writes() -> None:
    row = run_target(Target("over-reporting", "scheduler", None, OverReportingOnDisk), [0, 1, 2], 150, 100)
    assert row.verdict == "VIOLATION" and row.first_id == "INV-CONTENT", row.result
