"""kvoracle's storage tier for SGLang's HiCache: a backend behind SGLang's own
`HiCacheStorage` interface whose every read and write ends the way the checking machine
says (kvcache.faults.Fault), loaded through SGLang's "dynamic" storage backend:

    hicache_storage_backend="dynamic",
    hicache_storage_backend_extra_config=json.dumps({"backend_name": "kvoracle",
        "module_path": "kvoracle.oracle.engines.sglang_storage", "class_name": "KvoracleStorage"})

SGLang's cache controller calls the backend from its own threads (the backup thread
writes, the prefetch I/O thread reads). Every `batch_get` / `batch_set` parks its
thread until the scheduler's thread (the adapter) decides it: `Plan.decide` hands the
parked calls their faults one at a time, in a fixed order, so that which call suffers
which fault does not depend on thread timing. A decided call then does what its fault
says: OK succeeds; RAISE raises; ERROR fails every page; PARTIAL(k) succeeds for the
first k pages only; LATE(d) stays parked until d ticks later, then succeeds. `exists`
(the prefetch thread's hit query) is a lookup, not a transfer: it answers at once.

Importing this module does not import SGLang: the backend class is built on first use
(SGLang looks it up by name, which goes through the module's __getattr__).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kvoracle.kvcache.faults import Fault, FaultKind

OK = Fault(FaultKind.OK)


class StorageFault(IOError):
    """What a storage call that the machine made RAISE raises."""


@dataclass(eq=False)
class Call:
    """One storage call, parked until the scheduler's thread decides it."""

    kind: str  # "write" or "read"
    keys: tuple[str, ...]
    thread: threading.Thread
    operation: Any  # the controller's operation the call serves (from the caller's frame)
    go: threading.Event = field(default_factory=threading.Event)
    fault: Fault | None = None  # None: not decided yet
    due: int | None = None  # LATE: the tick at which it answers

    def order(self) -> tuple[int, tuple[str, ...]]:
        return (0 if self.kind == "write" else 1, self.keys)


class Plan:
    """The faults of the storage calls of the current scheduler call, and the calls
    parked for a decision. Shared by the scheduler's thread and the controller's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: deque[Fault] = deque()
        self.parked: list[Call] = []
        self.now = 0  # ticks so far (the adapter advances it)
        self.closed = False
        self.kinds = frozenset({"read", "write"})  # the calls that take faults; the others succeed
        self.slow: dict[str, int] = {}  # kind -> ticks every call of that kind takes (a slow storage tier)
        self.injected = 0  # calls that suffered a fault other than OK
        self.log: list[tuple[str, int, str]] = []  # (kind, pages, fault) per decided call

    # --- the scheduler's thread -------------------------------------------------------------
    def push(self, faults: Iterable[Fault]) -> None:
        """The faults of the next storage calls, in order (later calls succeed)."""
        with self.lock:
            self.faults.extend(faults)

    def clear(self) -> None:
        """Faults the call did not use do not carry over to the next call."""
        with self.lock:
            self.faults.clear()

    def parked_threads(self) -> set[threading.Thread]:
        """Threads waiting in a storage call for a decision or for their tick."""
        with self.lock:
            return {c.thread for c in self.parked if not c.go.is_set()}

    def pending(self) -> list[Call]:
        with self.lock:
            return [c for c in self.parked if not c.go.is_set()]

    def decide(self) -> Call | None:
        """Decide one parked call and let it go, or None when none can go now: the
        undecided calls take the next faults in order (writes first, then reads); a LATE
        call stays parked until its tick comes."""
        with self.lock:
            for call in sorted((c for c in self.parked if c.fault is None), key=Call.order):
                if self.faults and call.kind in self.kinds:
                    call.fault = self.faults.popleft()
                elif self.slow.get(call.kind):
                    call.fault = Fault(FaultKind.LATE, delay=self.slow[call.kind])
                else:
                    call.fault = OK
                self.log.append((call.kind, len(call.keys), str(call.fault)))
                if call.fault.kind is not FaultKind.OK and call.fault.delay != self.slow.get(call.kind):
                    self.injected += 1
                if call.fault.kind is FaultKind.LATE:
                    call.due = self.now + call.fault.delay
                    continue
                return self._release(call)
            for call in sorted(self.parked, key=Call.order):
                if call.due is not None and call.due <= self.now:
                    return self._release(call)
            return None

    def _release(self, call: Call) -> Call:
        self.parked.remove(call)
        call.go.set()
        return call

    def close(self) -> None:
        """The engine is going away: every parked call returns at once (as a failure)."""
        with self.lock:
            self.closed = True
            for call in self.parked:
                call.go.set()
            self.parked.clear()

    # --- the controller's threads -----------------------------------------------------------
    def enter(self, kind: str, keys: Sequence[str]) -> Fault:
        """Park the calling thread until its call is decided; the fault to apply."""
        call = Call(kind, tuple(keys), threading.current_thread(), _operation())
        with self.lock:
            if self.closed:
                return Fault(FaultKind.ERROR)
            self.parked.append(call)
        call.go.wait()
        if self.closed or call.fault is None:
            return Fault(FaultKind.ERROR)
        return call.fault


def _operation() -> Any:
    """The controller's operation (prefetch or backup) the storage call serves: the
    `operation` local of the nearest caller that has one (SGLang's _page_transfer,
    _generic_page_get, _page_backup all name it so)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        if "operation" in frame.f_locals:
            return frame.f_locals["operation"]
        frame = frame.f_back
    return None


def succeeded(fault: Fault, pages: int) -> int:
    """How many leading pages of a call succeed under `fault` (RAISE is the caller's)."""
    if fault.kind is FaultKind.ERROR:
        return 0
    if fault.kind is FaultKind.PARTIAL:
        return min(fault.done, pages)
    return pages


def _build() -> type:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    class KvoracleStorage(HiCacheStorage):  # type: ignore[misc]
        """Pages in a dict of this instance (one storage tier per engine); every read
        and write parked for the machine's decision (module docstring)."""

        def __init__(self, storage_config: Any = None, kwargs: Any = None, *args: Any, **more: Any) -> None:
            self.plan = Plan()
            self.pages: dict[str, Any] = {}

        def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
            return self.batch_get([key], [target_location])[0]

        def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
            fault = self.plan.enter("read", keys)
            if fault.kind is FaultKind.RAISE:
                raise StorageFault(f"injected storage read error ({len(keys)} pages)")
            ok = succeeded(fault, len(keys))
            out: list[Any] = []
            for i, key in enumerate(keys):
                page = self.pages.get(key) if i < ok else None
                if page is None:
                    out.append(None)
                    continue
                dst = target_locations[i] if target_locations is not None else None
                if dst is not None:
                    dst.copy_(page)
                    out.append(dst)
                else:
                    out.append(page.clone())
            return out

        def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
            return bool(self.batch_set([key], [value]))

        def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                      target_sizes: Any = None) -> bool:
            fault = self.plan.enter("write", keys)
            if fault.kind is FaultKind.RAISE:
                raise StorageFault(f"injected storage write error ({len(keys)} pages)")
            ok = succeeded(fault, len(keys))
            for key, value in list(zip(keys, values or ()))[:ok]:
                self.pages[key] = value.detach().clone()
            return ok == len(keys)

        def exists(self, key: str) -> bool:
            return key in self.pages

        def clear(self) -> None:
            self.pages.clear()

    return KvoracleStorage


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """SGLang's dynamic loader looks the class up by name: build it then."""
    if name != "KvoracleStorage":
        raise AttributeError(name)
    if name not in _CLASSES:
        _CLASSES[name] = _build()
    return _CLASSES[name]
