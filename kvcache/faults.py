"""A seeded, replayable fault injector: it wraps a storage backend and decides, call by call,
how the transfer goes wrong and which answers (if any) its caller will hear, and when.

Faults are decided by a plan object, never by monkeypatching, so a failing run replays from
the list of faults it printed (ScriptedFaults).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Iterator, Protocol, Sequence, TypeAlias

from kvoracle.kvcache.storage import StorageBackend, StorageError
from kvoracle.spec.types import BlockHash, Error, Ok, Outcome, Partial


class FaultKind(Enum):
    OK = "ok"
    RAISE = "raise"  # the call raises StorageError; nothing is done
    ERROR = "error"  # answers Error; nothing is done
    PARTIAL = "partial"  # only the first `done` items are done, and the answer says so
    HANG = "hang"  # the work may be done, but no answer ever comes
    LATE = "late"  # the answer comes after `delay` ticks
    TWICE = "twice"  # the answer comes now and again after `delay` ticks (a duplicate)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    done: int = 0  # PARTIAL: items that succeed
    delay: int = 0  # LATE, TWICE: ticks until the (second) answer

    def __post_init__(self) -> None:
        if self.done < 0 or self.delay < 0:
            raise ValueError(f"fault {self.kind.value}: done={self.done} and delay={self.delay} must be >= 0")

    def __str__(self) -> str:
        name = self.kind.name.lower()
        if self.kind is FaultKind.PARTIAL:
            return f"{name}({self.done})"
        if self.kind in (FaultKind.LATE, FaultKind.TWICE):
            return f"{name}({self.delay})"
        return name

    def __repr__(self) -> str:  # evaluable, so a printed counterexample can be replayed
        extra = f", done={self.done}" if self.done else ""
        extra += f", delay={self.delay}" if self.delay else ""
        return f"Fault(FaultKind.{self.kind.name}{extra})"

    @staticmethod
    def parse(word: str) -> Fault:
        """The fault `str` writes as `word`: "raise", "partial(1)", "late(2)"."""
        found = _WORD.fullmatch(word)
        kind = _KINDS.get(found.group(1)) if found else None
        counted = kind in (FaultKind.PARTIAL, FaultKind.LATE, FaultKind.TWICE)
        if found is None or kind is None or counted != (found.group(2) is not None):
            raise ValueError(f"no fault is written {word!r}: write one of {', '.join(_KINDS)}, the counted ones "
                             "with their count: partial(DONE), late(DELAY), twice(DELAY)")
        if kind is FaultKind.PARTIAL:
            return Fault(kind, done=int(found.group(2)))
        return Fault(kind, delay=int(found.group(2))) if counted else Fault(kind)


_WORD = re.compile(r"([a-z]+)(?:\((\d+)\))?")
_KINDS = {k.name.lower(): k for k in FaultKind}


OK_FAULT = Fault(FaultKind.OK)


class FaultPlan(Protocol):
    def next_fault(self, op: str, items: int) -> Fault:
        """The fault for the next call: `op` is "write" or "read" (storage), "swap_out" or
        "swap_in" (the copier); `items` its batch size."""
        ...


class NoFaults:
    def next_fault(self, op: str, items: int) -> Fault:
        return OK_FAULT


class ScriptedFaults:
    """The given faults in order, then OK forever; `push` appends one (e.g. from a test rule)."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self._queue: deque[Fault] = deque(faults)

    def push(self, fault: Fault) -> None:
        self._queue.append(fault)

    def next_fault(self, op: str, items: int) -> Fault:
        return self._queue.popleft() if self._queue else OK_FAULT

    def clear(self) -> None:
        """Drop the faults not used up, so they cannot leak into a later call."""
        self._queue.clear()

    @contextmanager
    def injecting(self, faults: Iterable[Fault] | str) -> Iterator[None]:
        """The I/O calls made inside suffer `faults`, in order (or the faults written as
        words: "ok raise late(2)"); none is left over after."""
        if isinstance(faults, str):
            faults = [Fault.parse(word) for word in faults.split()]  # each word judged before any is queued
        for f in faults:
            self.push(f)
        try:
            yield
        finally:
            self.clear()


@dataclass(frozen=True)
class Answer:
    """One answer to a call, heard `delay` ticks after it (0 = at once)."""

    delay: int
    outcome: Outcome


# Every answer the caller will hear; () means none ever comes and the caller's timeout decides.
Reply: TypeAlias = tuple[Answer, ...]


def _outcome(done: int, items: int, short_is_error: bool) -> Outcome:
    if done >= items:
        return Ok()
    if done == 0 and short_is_error:
        return Error()
    return Partial(done)


def deliver(fault: Fault, outcome: Outcome) -> Reply:
    """The answers for a call that did its work and whose true result is `outcome`."""
    if fault.kind is FaultKind.HANG:
        return ()
    if fault.kind is FaultKind.LATE:
        return (Answer(fault.delay, outcome),)
    if fault.kind is FaultKind.TWICE:
        return (Answer(0, outcome), Answer(fault.delay, outcome))
    return (Answer(0, outcome),)


class FaultyStorage:
    """A backend behind a fault plan. Only write and read are faulted; exists is
    bookkeeping that the engine's transfer protocol does not go through."""

    def __init__(self, backend: StorageBackend, plan: FaultPlan) -> None:
        self.backend = backend
        self.plan = plan
        self.injected: Counter[FaultKind] = Counter()  # non-OK faults only

    def _next(self, op: str, first: BlockHash | None, items: int) -> Fault:
        fault = self.plan.next_fault(op, items)
        if fault.kind is not FaultKind.OK:
            self.injected[fault.kind] += 1
        if fault.kind is FaultKind.RAISE:
            at = "an empty batch" if first is None else f"block {first:016x}"
            raise StorageError(f"injected fault: {op} of {items} blocks failed at {at}")
        return fault

    def write(self, blocks: Sequence[tuple[BlockHash, bytes]]) -> Reply:
        fault = self._next("write", blocks[0][0] if blocks else None, len(blocks))
        if fault.kind is FaultKind.ERROR:
            return (Answer(0, Error()),)
        if fault.kind is FaultKind.PARTIAL:
            return (Answer(0, Partial(self.backend.write(blocks[: fault.done]))),)
        # OK, HANG, LATE, TWICE: the write happens; a short backend write is told truthfully.
        n = self.backend.write(blocks)
        return deliver(fault, _outcome(n, len(blocks), short_is_error=True))

    def read(self, hashes: Sequence[BlockHash]) -> tuple[Reply, list[bytes]]:
        fault = self._next("read", hashes[0] if hashes else None, len(hashes))
        if fault.kind is FaultKind.ERROR:
            return (Answer(0, Error()),), []
        if fault.kind is FaultKind.HANG:
            return (), []  # no answer, so the caller may not use any data
        if fault.kind is FaultKind.PARTIAL:
            data = self.backend.read(hashes[: fault.done])
            return (Answer(0, Partial(len(data))),), data
        # OK, LATE, TWICE: a read miss is a short hit, not an error.
        data = self.backend.read(hashes)
        return deliver(fault, _outcome(len(data), len(hashes), short_is_error=False)), data

    def exists(self, hashes: Sequence[BlockHash]) -> int:
        return self.backend.exists(hashes)


class SwapError(Exception):
    """A swap copy between GPU and CPU failed by raising."""


class FaultyCopier:
    """GPU<->CPU swap copies behind a fault plan: the same faults as storage, no backend."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.injected: Counter[FaultKind] = Counter()

    def copy(self, op: str, items: int) -> Reply:
        fault = self.plan.next_fault(op, items)
        if fault.kind is not FaultKind.OK:
            self.injected[fault.kind] += 1
        if fault.kind is FaultKind.RAISE:
            raise SwapError(f"injected fault: {op} of {items} blocks failed")
        if fault.kind is FaultKind.ERROR:
            return (Answer(0, Error()),)
        if fault.kind is FaultKind.PARTIAL:
            return (Answer(0, Partial(min(fault.done, items))),)
        return deliver(fault, Ok())
