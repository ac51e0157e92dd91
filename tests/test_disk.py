"""The storage tier on disk under the scheduler machine: the damage a disk does
(oracle.disk), the reference surviving it, and a storage tier that trusts its files
caught by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoracle.kvcache.storage import DirectoryStorage
from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.campaign import run_seeds
from kvoracle.oracle.disk import DAMAGE, damage, fresh_directory
from kvoracle.oracle.engines.reference_scheduler import ReferenceSchedulerOnDisk
from kvoracle.oracle.scheduler_machine import DiskMachine
from kvoracle.spec.types import BlockHash

H = [BlockHash(0xABCD_0000 + i) for i in range(3)]
BLOCKS = [(h, bytes([i + 1]) * 40) for i, h in enumerate(H)]


def stored(tmp_path: Path) -> DirectoryStorage:
    store = DirectoryStorage(tmp_path / "blocks")
    assert store.write(BLOCKS) == 3
    return store


@pytest.mark.parametrize("how", ["truncate", "corrupt", "delete"])
def test_a_damaged_block_ends_the_prefix_read_there(tmp_path: Path, how: str) -> None:
    store = stored(tmp_path)
    damage(store.root, how, 1)  # the second file written: H[1]
    assert store.read(H) == [BLOCKS[0][1]]
    assert store.exists(H) == 1 and H[1] not in store and len(store) == 2


def test_an_unmounted_volume_writes_and_reads_nothing_until_it_is_back(tmp_path: Path) -> None:
    store = stored(tmp_path)
    damage(store.root, "unmount", 0)
    assert store.read(H) == [] and store.write(BLOCKS) == 0
    damage(store.root, "unmount", 0)  # already gone: nothing more happens
    damage(store.root, "remount", 0)
    assert store.read(H) == [data for _, data in BLOCKS]
    damage(store.root, "remount", 0)  # already back: nothing happens
    assert store.exists(H) == 3


def test_damage_with_nothing_to_act_on_does_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for how in DAMAGE:
        damage(empty, how, 5)
    assert empty.is_dir() and not list(empty.iterdir())


def test_unknown_damage_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown damage 'melt'"):
        damage(tmp_path, "melt", 0)


def test_fresh_directory_is_empty_and_reused_by_the_process() -> None:
    first = Path(fresh_directory())
    (first / "leftover").write_bytes(b"x")
    again = Path(fresh_directory())
    assert again == first and not list(again.iterdir())


def campaign(adapter: type[ReferenceSchedulerOnDisk], examples: int) -> tuple[str, Tally]:
    tally = Tally()
    machine = type(f"Machine_{adapter.__name__}", (DiskMachine,), {"make_adapter": adapter, "tally": tally})
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
        return blob[28:] if len(blob) >= 28 else None  # the header: magic 4, length 8, checksum 16 bytes


class TrustingOnDisk(ReferenceSchedulerOnDisk):
    storage = "TrustingStorage(fresh_directory())"

    def given(self) -> dict[str, object]:
        return {**super().given(), "TrustingStorage": TrustingStorage}


def test_a_storage_tier_that_trusts_its_files_is_caught() -> None:
    """Corrupt bytes read back into a request's blocks: INV-CONTENT (the bytes no
    longer match the request's tokens)."""
    verdict, _ = campaign(TrustingOnDisk, 100)
    assert verdict == "INV-CONTENT"
