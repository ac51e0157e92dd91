"""The storage tier's backends and the fault injector that wraps them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

import pytest

from kvoracle.kvcache.faults import (
    Answer,
    Fault,
    FaultKind,
    FaultyStorage,
    NoFaults,
    Reply,
    ScriptedFaults,
)
from kvoracle.kvcache.storage import BadBlockHash, DirectoryStorage, MemoryStorage, StorageBackend, StorageError
from kvoracle.spec.types import BlockHash, Error, Ok, Partial, RequestId

H = [BlockHash(0x1234_5678_9ABC_DEF0 + i) for i in range(4)]
DATA = [bytes([i]) * (16 + i) for i in range(4)]
BLOCKS = list(zip(H, DATA))


@pytest.fixture(params=["memory", "directory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StorageBackend:
    return MemoryStorage() if request.param == "memory" else DirectoryStorage(tmp_path / "blocks")


def block_file(root: Path, h: BlockHash) -> Path:
    return root / f"{h:016x}"


# --- backends ----------------------------------------------------------------------


def test_round_trip(backend: StorageBackend) -> None:
    assert backend.write(BLOCKS) == 4
    assert backend.read(H) == DATA
    assert backend.exists(H) == 4
    assert backend.write([(H[0], b"new")]) == 1  # overwrite
    assert backend.read(H[:1]) == [b"new"]
    assert backend.write([]) == 0 and backend.read([]) == [] and backend.exists([]) == 0


def test_empty_payload_round_trips(backend: StorageBackend) -> None:
    assert backend.write([(H[0], b"")]) == 1
    assert backend.read(H[:1]) == [b""]


def test_read_and_exists_stop_at_first_missing(backend: StorageBackend) -> None:
    backend.write([BLOCKS[0], BLOCKS[1], BLOCKS[3]])
    assert backend.exists(H) == 2
    assert backend.read(H) == DATA[:2]
    assert backend.exists([H[2], H[3]]) == 0
    assert backend.read([H[3], H[0]]) == [DATA[3], DATA[0]]


def test_len_and_contains(tmp_path: Path) -> None:
    for s in (MemoryStorage(), DirectoryStorage(tmp_path)):
        s.write(BLOCKS[:2])
        assert len(s) == 2
        assert H[1] in s and H[2] not in s


def test_directory_creates_root_and_names_files(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    s = DirectoryStorage(root)
    s.write([(BlockHash(0xAB), b"x")])
    assert sorted(p.name for p in root.iterdir()) == ["00000000000000ab"]
    assert DirectoryStorage(root).read([BlockHash(0xAB)]) == [b"x"]  # survives a reopen


def test_directory_leaves_no_temp_files(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    s.write(BLOCKS)
    s.write(BLOCKS[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{h:016x}" for h in H)


def test_directory_truncated_file_reads_as_absent(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    s.write(BLOCKS)
    for cut in (3, 10, -1):  # inside the header, and one byte short of the payload
        f = block_file(tmp_path, H[1])
        s.write([BLOCKS[1]])
        f.write_bytes(f.read_bytes()[:cut])
        assert s.read(H) == DATA[:1]
        assert s.exists(H) == 1
        assert H[1] not in s and len(s) == 3


def test_directory_corrupt_byte_reads_as_absent(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    s.write(BLOCKS)
    f = block_file(tmp_path, H[2])
    blob = bytearray(f.read_bytes())
    for i in range(len(blob)):  # every byte: magic, length, checksum and payload
        bad = blob.copy()
        bad[i] ^= 0x01
        f.write_bytes(bytes(bad))
        assert s.read(H) == DATA[:2], i
        assert s.exists(H) == 2
    f.write_bytes(bytes(blob) + b"!")  # trailing garbage
    assert s.exists(H) == 2


def test_directory_failed_write_is_short_and_leaves_no_temp_file(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    block_file(tmp_path, H[2]).mkdir()  # os.replace onto a directory fails, like a full disk would
    assert s.write(BLOCKS) == 2
    assert s.read(H) == DATA[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{h:016x}" for h in H[:3])


def test_directory_file_under_another_name_reads_as_absent(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    s.write(BLOCKS[:1])
    block_file(tmp_path, H[0]).rename(block_file(tmp_path, H[1]))
    assert s.read([H[1]]) == []


def test_directory_rejects_hash_outside_64_bits(tmp_path: Path) -> None:
    s = DirectoryStorage(tmp_path)
    with pytest.raises(BadBlockHash, match="not an unsigned 64-bit") as e:
        s.write([BLOCKS[0], (BlockHash(1 << 64), b"x")])
    assert e.value.hash == 1 << 64  # the error names the offending hash
    assert s.exists(H) == 0  # refused before anything was written
    with pytest.raises(BadBlockHash) as e:
        s.read([BlockHash(-1)])
    assert e.value.hash == -1


# --- fault plans ---------------------------------------------------------------------


def test_scripted_faults_and_no_faults() -> None:
    plan = ScriptedFaults([Fault(FaultKind.HANG), Fault(FaultKind.LATE, delay=2)])
    plan.push(Fault(FaultKind.PARTIAL, done=1))
    got = [str(plan.next_fault("read", 3)) for _ in range(5)]
    assert got == ["hang", "late(2)", "partial(1)", "ok", "ok"]
    assert NoFaults().next_fault("write", 3) == Fault(FaultKind.OK)


def test_fault_str() -> None:
    assert [str(Fault(k, done=1, delay=3)) for k in FaultKind] == [
        "ok", "raise", "error", "partial(1)", "hang", "late(3)", "twice(3)"
    ]


def test_a_fault_written_as_its_word_reads_back_as_that_fault() -> None:
    """Every fault a campaign draws reads back from its word; a word no fault writes is a
    ValueError, and `injecting` refuses a string holding one before it queues any fault."""
    from kvoracle.oracle.scheduler_machine import FAULTS
    for f in (*FAULTS, Fault(FaultKind.OK), Fault(FaultKind.TWICE, delay=0)):
        assert Fault.parse(str(f)) == f
    for word in ("Raise", "late", "raise(2)", "partial()", "partial(-1)", "nope", ""):
        with pytest.raises(ValueError, match="no fault is written"):
            Fault.parse(word)
    plan = ScriptedFaults([])
    with plan.injecting("ok raise late(2)"):
        assert [str(plan.next_fault("read", 1)) for _ in range(4)] == ["ok", "raise", "late(2)", "ok"]
    plan.push(Fault(FaultKind.HANG))
    with pytest.raises(ValueError), plan.injecting("raise rasie"):
        pass
    assert plan.next_fault("read", 1) == Fault(FaultKind.HANG)  # nothing was queued before it


def test_the_reference_writes_faults_as_words_where_each_reads_back() -> None:
    """The reference scheduler's scripted call carries its faults as words, or as their
    reprs where a word would lose a field (a partial fault with a delay)."""
    from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
    a = ReferenceScheduler()
    a.submit(RequestId(0), [1, 2, 3])
    a.schedule([Fault(FaultKind.OK), Fault(FaultKind.RAISE), Fault(FaultKind.OK)])
    a.schedule([Fault(FaultKind.PARTIAL, done=1, delay=2)])
    assert a.lines[-2:] == ["with plan.injecting('ok raise'):\n    rm.schedule()",
                            "with plan.injecting([Fault(FaultKind.PARTIAL, done=1, delay=2)]):\n    rm.schedule()"]


# --- FaultyStorage ---------------------------------------------------------------------


def faulty(*faults: Fault) -> tuple[FaultyStorage, MemoryStorage]:
    mem = MemoryStorage()
    return FaultyStorage(mem, ScriptedFaults(faults)), mem


A_OK: Reply = (Answer(0, Ok()),)

WRITE_CASES: list[tuple[Fault, int, Reply]] = [
    # fault, blocks that land in the backend, reply
    (Fault(FaultKind.OK), 3, A_OK),
    (Fault(FaultKind.ERROR), 0, (Answer(0, Error()),)),
    (Fault(FaultKind.PARTIAL, done=2), 2, (Answer(0, Partial(2)),)),
    (Fault(FaultKind.PARTIAL, done=0), 0, (Answer(0, Partial(0)),)),
    (Fault(FaultKind.HANG), 3, ()),
    (Fault(FaultKind.LATE, delay=3), 3, (Answer(3, Ok()),)),
    (Fault(FaultKind.TWICE, delay=2), 3, (Answer(0, Ok()), Answer(2, Ok()))),
]


@pytest.mark.parametrize(("fault", "landed", "reply"), WRITE_CASES, ids=[str(c[0]) for c in WRITE_CASES])
def test_faulty_write(fault: Fault, landed: int, reply: Reply) -> None:
    fs, mem = faulty(fault)
    assert fs.write(BLOCKS[:3]) == reply
    assert mem.exists(H) == landed and len(mem) == landed
    assert fs.write(BLOCKS[3:]) == A_OK  # the script is spent: OK from now on


def test_faulty_raise_writes_nothing() -> None:
    fs, mem = faulty(Fault(FaultKind.RAISE), Fault(FaultKind.RAISE))
    with pytest.raises(StorageError, match=f"write.*{H[0]:016x}"):
        fs.write(BLOCKS)
    assert len(mem) == 0
    mem.write(BLOCKS)
    with pytest.raises(StorageError, match=f"read.*{H[1]:016x}"):
        fs.read(H[1:])


READ_CASES: list[tuple[Fault, Reply, int]] = [
    # fault, reply, blocks of data returned; the backend holds H[0..2] and the read asks H[0..3]
    (Fault(FaultKind.OK), (Answer(0, Partial(3)),), 3),
    (Fault(FaultKind.ERROR), (Answer(0, Error()),), 0),
    (Fault(FaultKind.PARTIAL, done=2), (Answer(0, Partial(2)),), 2),
    (Fault(FaultKind.PARTIAL, done=4), (Answer(0, Partial(3)),), 3),
    (Fault(FaultKind.HANG), (), 0),
    (Fault(FaultKind.LATE, delay=3), (Answer(3, Partial(3)),), 3),
    (Fault(FaultKind.TWICE, delay=1), (Answer(0, Partial(3)), Answer(1, Partial(3))), 3),
]


@pytest.mark.parametrize(("fault", "reply", "returned"), READ_CASES, ids=[str(c[0]) for c in READ_CASES])
def test_faulty_read(fault: Fault, reply: Reply, returned: int) -> None:
    fs, mem = faulty(fault)
    mem.write(BLOCKS[:3])
    assert fs.read(H) == (reply, DATA[:returned])
    assert len(mem) == 3  # a read never changes what is stored


def test_faulty_read_full_hit_is_ok() -> None:
    fs, mem = faulty(Fault(FaultKind.LATE, delay=2))
    mem.write(BLOCKS)
    assert fs.read(H) == ((Answer(2, Ok()),), DATA)
    assert fs.read(H[:2]) == (A_OK, DATA[:2])


class ShortStorage(MemoryStorage):
    """A backend whose disk fills up after `room` blocks."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
        n = super().write(blocks[: self.room])
        self.room -= n
        return n


def test_faulty_write_reports_short_backend_write() -> None:
    plan = ScriptedFaults([Fault(FaultKind.OK), Fault(FaultKind.LATE, delay=1)])
    fs = FaultyStorage(ShortStorage(room=2), plan)
    assert fs.write(BLOCKS[:3]) == (Answer(0, Partial(2)),)
    assert fs.write(BLOCKS[3:]) == (Answer(1, Error()),)  # the delayed answer tells the truth too


def test_a_planned_partial_write_reports_what_the_backend_wrote() -> None:
    """A partial fault plans 3 blocks; the backend (a full disk) takes 2: the answer says 2,
    or the cache would count as stored a block that is not there."""
    fs = FaultyStorage(ShortStorage(room=2), ScriptedFaults([Fault(FaultKind.PARTIAL, done=3)]))
    assert fs.write(BLOCKS[:4]) == (Answer(0, Partial(2)),)
    assert fs.backend.exists(H) == 2


def test_backend_error_propagates() -> None:
    class Broken(MemoryStorage):
        def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> int:
            raise StorageError("disk on fire")

    with pytest.raises(StorageError, match="on fire"):
        FaultyStorage(Broken(), NoFaults()).write(BLOCKS)


def test_exists_passes_through_without_faults() -> None:
    fs, mem = faulty(Fault(FaultKind.RAISE))
    mem.write(BLOCKS[:2])
    assert fs.exists(H) == 2
    with pytest.raises(StorageError):  # the scripted fault was not used up by exists
        fs.write(BLOCKS)
    assert fs.injected == {FaultKind.RAISE: 1}


def test_injected_counter() -> None:
    kinds = [FaultKind.OK, FaultKind.ERROR, FaultKind.HANG, FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.TWICE]
    fs, _ = faulty(*(Fault(k, done=1, delay=1) for k in kinds))
    for i in range(len(kinds)):
        if i % 2:
            fs.read(H)
        else:
            fs.write(BLOCKS)
    assert fs.injected == {FaultKind.ERROR: 2, FaultKind.HANG: 1, FaultKind.PARTIAL: 1, FaultKind.TWICE: 1}
    assert FaultKind.OK not in fs.injected


def test_faulty_storage_replays_its_plan() -> None:
    rnd = random.Random(11)
    kinds = [k for k in FaultKind if k is not FaultKind.RAISE]
    plan = [Fault(rnd.choice(kinds), done=rnd.randrange(4), delay=rnd.randint(1, 4)) for _ in range(100)]

    def run() -> list[tuple[Reply, list[bytes]]]:
        fs = FaultyStorage(MemoryStorage(), ScriptedFaults(plan))
        out = []
        for i in range(50):
            fs.write(BLOCKS[i % 4 :])
            out.append(fs.read(H))
        return out

    assert run() == run()


@pytest.mark.parametrize("fault", [Fault(FaultKind.OK), Fault(FaultKind.ERROR), Fault(FaultKind.PARTIAL, done=1),
                                   Fault(FaultKind.LATE, delay=2), Fault(FaultKind.PARTIAL, done=2, delay=3)])
def test_a_printed_fault_replays_as_the_same_fault(fault: Fault) -> None:
    """A counterexample's faults are printed so that they can be pasted back and replayed."""
    assert eval(repr(fault), {"Fault": Fault, "FaultKind": FaultKind}) == fault
    assert repr(fault).startswith(f"Fault(FaultKind.{fault.kind.name}")
