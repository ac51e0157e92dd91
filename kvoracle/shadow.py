"""Shadow mode: kvoracle's checks riding along inside a running engine and its own tests.

    shadow = kvoracle.shadow.attach(mgr, engine="vllm")        # tests: raise on an alarm
    shadow = kvoracle.shadow.attach(mgr, engine="vllm", mode="record")  # serving: record, go on

`attach` wraps the methods an observer names on the engine's objects. After each
*outermost* call that returns normally (a wrapped method called by another wrapped
method is part of its caller), shadow evaluates every property of spec/ that the
observation allows: spec.invariants.check on a view built by oracle.engine.view_of,
LIVE-EXIT when the call ends a request, LIVE-DRAIN at the audit when nothing is live,
and, for an observer that sees a scheduler's steps (`progress`), LIVE-ADMIT and
LIVE-PROGRESS after each step (spec.liveness.scheduled).
Shadow never judges by itself: it builds views and runs spec's predicates on them.

It never changes the engine's behaviour: arguments reach the engine as given (summaries
never iterate a one-shot iterator), results come back untouched, and an exception the
engine raises passes through as the same object (with a note added when spec judges
that raise: LIVE-EXIT on an exit path that raised). The only thing shadow may raise is ShadowAlarm,
after a call that returned normally, in "raise" mode.

Cost stays bounded. An observer that can say which blocks a call changed gets an
incremental check: the observation restricted to those blocks (in runs of ids), and a
full check confirms any incremental alarm before it is reported. An observer that
cannot gets a full check every `interval` calls. A full audit runs every `full_every`
calls, and at the end (`audit()`, the pytest plugin's end of test, process exit).

On a violation the report (an Alarm) names the property ID, the blocks involved, the
last N calls that touched those blocks (a bounded ring buffer of calls with their
arguments summarised), and a reproduction file: the engine rebuilt from the observer's
preamble, shadow attached, and the calls made since attach replayed.

The pytest plugin lives in this module:

    pytest -p kvoracle.shadow --kvoracle-shadow vllm [--kvoracle-shadow-report]

attaches to every engine object the test session creates, prints a summary, and fails
the session on an alarm unless asked only to report. For a process you do not write:

    KVORACLE_SHADOW=vllm[,report] python -m kvoracle.shadow -m your.server --args
    KVORACLE_SHADOW=vllm[,report] python -c "import kvoracle.shadow; ..."   # on import

docs/shadow.md is the user's page.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import itertools
import os
import re
import sys
import tempfile
import threading
import types
import weakref
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, TypeVar, cast, runtime_checkable

from kvoracle.oracle.engine import Observation, view_of
from kvoracle.oracle.unchecked import observation_gaps
from kvoracle.spec import invariants, liveness
from kvoracle.spec.invariants import Violation
from kvoracle.spec.view import View

if TYPE_CHECKING:
    import pytest

_T = TypeVar("_T")
_MISSING = object()
MAX_ALARMS = 1000  # kept per tally (serving runs long: the count by ID goes on)
ENV = "KVORACLE_SHADOW"  # ENGINE[,report]
ENV_DIR = "KVORACLE_SHADOW_DIR"  # where reproduction files go
Mode = Literal["raise", "record"]

# The observers kvoracle ships, by engine name (importing them does not import the engine).
ENGINES: dict[str, str] = {
    "vllm": "kvoracle.oracle.engines.shadow_vllm:VllmObserver",
    "vllm-scheduler": "kvoracle.oracle.engines.shadow_vllm:VllmSchedulerObserver",
    "sglang": "kvoracle.oracle.engines.shadow_sglang:SglangObserver",
}

__all__ = ["ENGINES", "Alarm", "Call", "Invocation", "Observer", "ObserverBase", "Progress", "Shadow", "ShadowAlarm",
           "Tally", "attach", "install", "restrict", "summarise", "uninstall"]


# --- what a call is, as the observer and the ring buffer see it -------------------------


class Invocation:
    """One outermost call in progress: `target` is the observer's label for the object
    ("mgr", "pool"), `method` the method's name; args and kwargs as the caller passed them."""

    __slots__ = ("target", "method", "args", "kwargs")

    def __init__(self, target: str, method: str, args: tuple[object, ...], kwargs: Mapping[str, object]) -> None:
        self.target, self.method, self.args, self.kwargs = target, method, args, kwargs

    def arg(self, position: int, name: str, default: object = None) -> object:
        """The argument at `position`, or passed as `name`."""
        if position < len(self.args):
            return self.args[position]
        return self.kwargs.get(name, default)

    @property
    def name(self) -> str:
        return f"{self.target}.{self.method}"


@dataclass(frozen=True)
class Call:
    """A call in the ring buffer: numbered in order, arguments and outcome summarised, and
    the blocks it changed (None: the observer could not say, and the text says nothing).

    An audit is no call: the alarms it raises name, as `after`, an entry with `audit` set,
    numbered as the last call before it (`seq`, 0: none yet), which `args` shows."""

    seq: int
    name: str
    args: str
    outcome: str
    blocks: frozenset[int] | None
    where: str = ""  # the test that made it (pytest plugin)
    audit: bool = False

    def __str__(self) -> str:
        if self.audit:
            return f"audit(), after call #{self.seq} {self.args}" if self.seq else "audit(), before any call"
        touched = "" if self.blocks is None else f"  [blocks {_ids(self.blocks)}]" if self.blocks else "  [no block]"
        return f"#{self.seq} {self.name}({self.args}) {self.outcome}{touched}"


@dataclass(frozen=True)
class Alarm:
    """A property of spec/ found broken after a call (`violation` is spec's own verdict)."""

    violation: Violation
    engine: str
    blocks: tuple[int, ...]  # the blocks the verdict names (else those the call changed)
    after: Call
    history: tuple[Call, ...]  # oldest first: the last calls that touched those blocks
    reproduction: str | None  # path of the reproduction file, if one was written
    check: str  # "incremental" (confirmed by a full check), "full", "exit", "raise", "audit"

    @property
    def id(self) -> str:
        return self.violation.id

    @property
    def message(self) -> str:
        return self.violation.message

    def report(self) -> str:
        where = f" (in {self.after.where})" if self.after.where else ""
        lines = [f"{self.violation}",
                 f"  engine:  {self.engine}, found by the {self.check} check after call #{self.after.seq}{where}",
                 f"  blocks:  {_ids(self.blocks) or 'not named by the verdict'}",
                 f"  after:   {self.after}",
                 f"  history: {_calls(len(self.history))} that touched "
                 f"{'these blocks' if self.blocks else 'the engine'} (oldest first)"]
        lines += [f"    {c}" for c in self.history]
        if self.reproduction:
            lines.append(f"  reproduction: python {self.reproduction}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class ShadowAlarm(AssertionError):
    """Raised in "raise" mode after the call that broke a property; `.alarms` hold them."""

    def __init__(self, alarms: Sequence[Alarm]) -> None:
        self.alarms = list(alarms)
        super().__init__("kvoracle shadow: " + "\n".join(a.report() for a in self.alarms))


# --- the observer -----------------------------------------------------------------------


@runtime_checkable
class Observer(Protocol):
    """How shadow sees one engine instance: which methods to wrap, and how to observe.

    Required: `targets` and `observe`. Everything else has a default in ObserverBase:
    an observer that can say which blocks a call changed (`after`) and observe a range of
    ids (`observe_range`) gets incremental checks; one that cannot is checked in full at
    an interval."""

    engine: ClassVar[str]  # a name for reports
    classes: ClassVar[tuple[str, ...]]  # "module:Class" of the engine objects it attaches to
    block_size: int

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        """(label, object, method names) to wrap; the first object is the one attached to."""
        ...

    def ids(self) -> range:
        """Every block id the engine may hand out."""
        ...

    def observe(self) -> Observation:
        """The full observation (oracle.engine.Observation); resynchronises any index."""
        ...

    def observe_range(self, ids: range) -> Observation | None:
        """The observation restricted to `ids` (ids=ids, every structure cut to them), or
        None: not supported (checks are full, at an interval)."""
        ...

    def before(self, call: Invocation) -> object:
        """Note what `after` will need (runs before the engine's method); returns a token."""
        ...

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        """Update the observer's bookkeeping after a normal return; the blocks the call
        changed (empty: none), or None when it cannot say."""
        ...

    def exiting(self, call: Invocation) -> str | None:
        """The request (a table name) that this call ends, for LIVE-EXIT; None: none."""
        ...

    def table(self, request: str) -> Collection[int]:
        """The blocks `request` lists now (for LIVE-EXIT)."""
        ...

    def on_raise(self, call: Invocation, error: BaseException) -> list[Violation]:
        """spec's verdict (spec.liveness, e.g. live_evict) on a call that raised, beyond
        LIVE-EXIT, which shadow evaluates itself on an exit that raised; [] for none."""
        ...

    def quiescent(self) -> bool:
        """Nothing is live: every block must be free or reclaimable (LIVE-DRAIN)."""
        ...

    def describe(self, value: object) -> str | None:
        """A short summary of an engine value for the ring buffer; None: the default."""
        ...

    def reproduction(self) -> tuple[str, str] | None:
        """(preamble that rebuilds this engine, the expression naming the object attached
        to); None: it cannot be rebuilt."""
        ...

    def statement(self, call: Invocation) -> str | None:
        """The call as a statement in the preamble's namespace (before it runs); None:
        it cannot be written down (the reproduction then stops there)."""
        ...

    def progress(self) -> Progress | None:
        """What LIVE-ADMIT and LIVE-PROGRESS need of the engine now; None: this observer
        does not see scheduling steps."""
        ...

    def scheduling(self, call: Invocation) -> bool:
        """Whether the call is one scheduling step (judged by LIVE-ADMIT and LIVE-PROGRESS)."""
        ...

    def keeps_progress(self, call: Invocation) -> bool:
        """Whether a call between scheduling steps leaves LIVE-PROGRESS's count going (it
        lets time pass, adds a request, or takes in a step's results); any other (an exit
        from outside, an eviction) starts it again (spec.liveness.between). ObserverBase
        says no for every call: never an alarm that a call it does not know could explain."""
        ...


@dataclass(frozen=True)
class Progress:
    """A scheduler as LIVE-ADMIT and LIVE-PROGRESS see it at one moment: its view
    (`computed` for the running requests, `live`, `queued`, the GPU free list), the GPU
    blocks each queued request (`needs`) and each running one (`growth`) takes with its
    next token, where known, the room the engine may fill, and its transfers in flight."""

    view: View
    needs: Mapping[str, int]
    growth: Mapping[str, int]
    room: int
    in_flight: int


class ObserverBase:
    """Defaults for every optional part of the Observer Protocol."""

    engine: ClassVar[str] = "engine"
    classes: ClassVar[tuple[str, ...]] = ()
    block_size: int = 1

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        raise NotImplementedError

    def ids(self) -> range:
        return self.observe().ids

    def observe(self) -> Observation:
        raise NotImplementedError

    def observe_range(self, ids: range) -> Observation | None:
        return None

    def before(self, call: Invocation) -> object:
        return None

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        return None

    def exiting(self, call: Invocation) -> str | None:
        return None

    def table(self, request: str) -> Collection[int]:
        return (self.observe().tables or {}).get(request, ())

    def on_raise(self, call: Invocation, error: BaseException) -> list[Violation]:
        return []

    def quiescent(self) -> bool:
        return not (self.observe().tables or {})

    def describe(self, value: object) -> str | None:
        return None

    def reproduction(self) -> tuple[str, str] | None:
        return None

    def statement(self, call: Invocation) -> str | None:
        return None

    def progress(self) -> Progress | None:
        return None

    def scheduling(self, call: Invocation) -> bool:
        return False

    def keeps_progress(self, call: Invocation) -> bool:
        return False


# The optional parts without which something goes unchecked, and what (a summary's
# `not checked:` lines, with the observation's missing fields (unchecked.NEEDS), when every
# observer of the session leaves it unchecked).
WITHOUT: tuple[tuple[str, str], ...] = (
    ("exiting", "LIVE-EXIT (the observer has no exiting(): which call ends which request), so a request's "
                "exit that keeps its blocks passes while it looks live"),
    ("progress", "LIVE-ADMIT and LIVE-PROGRESS (the observer has no progress(): it does not see scheduling "
                 "steps)"),
    ("reproduction", "no reproduction files (the observer has no reproduction() and statement(): an alarm "
                     "shows its history only)"),
)


def lacking(cls: type) -> frozenset[str]:
    """The parts of WITHOUT an observer class leaves to ObserverBase's default (or lacks)."""
    return frozenset(part for part, _ in WITHOUT
                     if getattr(cls, part, None) in (None, getattr(ObserverBase, part)))


def restrict(o: Observation, ids: range) -> Observation:
    """A full observation cut to `ids` (an observer's observe_range when its full
    observation is cheap: correct, not cheaper). Counters and the tree are left out."""

    def cut(blocks: Iterable[int]) -> tuple[int, ...]:
        return tuple(b for b in blocks if b in ids)

    tables = None if o.tables is None else {r: t for r, t in ((r, cut(t)) for r, t in o.tables.items()) if t}
    return replace(
        o, ids=ids, free=None if o.free is None else cut(o.free),
        evictable=None if o.evictable is None else cut(o.evictable), tables=tables,
        cached=None if o.cached is None else frozenset(cut(o.cached)),
        refcounts=None if o.refcounts is None else {b: n for b, n in o.refcounts.items() if b in ids},
        counters={}, pinned=None if o.pinned is None else frozenset(cut(o.pinned)),
        in_flight=None if o.in_flight is None else cut(o.in_flight), nodes=None, findable=None,
    )


# --- the session ------------------------------------------------------------------------


@dataclass
class Tally:
    """What shadow did, over one or many attached objects (the plugin shares one)."""

    engines: int = 0
    calls: int = 0  # outermost calls seen
    checked: int = 0  # calls after which properties were evaluated
    incremental: int = 0  # of those, incrementally
    full: int = 0  # full evaluations (interval, audits, confirmations)
    alarms: list[Alarm] = field(default_factory=list)
    by_id: Counter[str] = field(default_factory=Counter)
    internal: list[str] = field(default_factory=list)  # shadow's own errors (never the engine's)
    unconfirmed: int = 0  # incremental alarms a full check did not confirm (index drift)
    steps: int = 0  # scheduling steps judged (LIVE-ADMIT, LIVE-PROGRESS)
    undrained: list[str] = field(default_factory=list)  # audits that found something still live: where, and what
    watching: list[str] = field(default_factory=list)  # the engine classes it attaches to, "module:Class"
    unfound: list[str] = field(default_factory=list)  # of those, the ones their module, once imported, lacks
    # observer -> what it leaves unchecked: the optional parts it lacks (WITHOUT), the fields its observation leaves out
    unchecked: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def unwatched(self) -> list[str]:
        """The modules of `watching` whose package this Python lacks, now: never imported,
        and not to be found (a test suite may put its engine on sys.path itself)."""
        return [m for m in dict.fromkeys(c.partition(":")[0] for c in self.watching) if _missing(m)]

    @property
    def misconfigured(self) -> bool:
        """An engine class it was asked to watch is not there (not installed, or misnamed):
        what it should have checked went unchecked, whatever else it watched."""
        return bool(self.unwatched or self.unfound)

    def summary(self, engine: str = "", alarms: int = 20, shown: Collection[int] = ()) -> str:
        """The summary; an alarm whose id() is in `shown` (already printed with its uncaught
        ShadowAlarm) is named in one line."""
        head = (f"kvoracle shadow{' (' + engine + ')' if engine else ''}: {self.engines} engine object(s), "
                f"{self.calls} calls, {self.checked} checked ({self.incremental} incrementally), "
                f"{self.full} full checks, " + (f"{self.steps} scheduling steps, " if self.steps else "")
                + f"{sum(self.by_id.values())} alarm(s)")
        lines = [head]
        if self.by_id:
            lines.append("alarms by ID: " + ", ".join(f"{k} {n}" for k, n in sorted(self.by_id.items())))
        for a in self.alarms[:alarms]:
            lines.append(f"{a.id} after call #{a.after.seq}: shown above, with the ShadowAlarm that ended the program"
                         if id(a) in shown else a.report())
        if len(self.alarms) > alarms:
            lines.append(f"... and {len(self.alarms) - alarms} more")
        if self.unconfirmed:
            lines.append(f"note: {self.unconfirmed} incremental finding(s) were not confirmed by a full check")
        if self.undrained:
            lines.append(f"note: LIVE-DRAIN was not judged at {len(self.undrained)} audit(s): something still held "
                         "blocks there (a request never finished, blocks taken and never given back)")
            lines += [f"  {where}" for where in self.undrained[:5]]
        for e in self.internal[:5]:
            lines.append(f"shadow's own error (the engine was not affected): {e}")
        for path in self.unwatched:
            package = path.partition(".")[0]
            lines.append(f"not watched: {path} (its package, {package}, is not installed in this Python)")
        lines += [f"not watched: {why}" for why in self.unfound]
        if self.engines == 0 and self.watching:
            lines.append(f"watched nothing: no {' or '.join(dict.fromkeys(self.watching))} object was created")
        gaps = list(self.unchecked.values())
        lines += [f"not checked: {what}" for what in dict.fromkeys(gaps[0] if gaps else ())
                  if all(what in g for g in gaps)]
        return "\n".join(lines)


_BLOCKS = re.compile(r"\b(?:blocks?|id) (\[[\d, ]*\]|\d+)")
_attached: dict[int, weakref.ref[Shadow]] = {}
_context = ""  # the test in progress (set by the pytest plugin)


def _ids(blocks: Iterable[int], most: int = 12) -> str:
    s = sorted(blocks)
    text = ", ".join(map(str, s[:most]))
    return text + (f", ... ({len(s)} in all)" if len(s) > most else "")


def _named_blocks(message: str) -> set[int]:
    """The block ids a verdict's message names (spec's messages say "block 3", "blocks [3, 4]")."""
    out: set[int] = set()
    for m in _BLOCKS.finditer(message):
        out.update(int(x) for x in re.findall(r"\d+", m.group(1)))
    return out


def _runs(blocks: Iterable[int], gap: int) -> list[range]:
    """Sorted ids as ranges, joining neighbours less than `gap` apart."""
    s = sorted(set(blocks))
    if not s:
        return []
    out: list[range] = []
    start = prev = s[0]
    for b in s[1:]:
        if b - prev > gap:
            out.append(range(start, prev + 1))
            start = b
        prev = b
    out.append(range(start, prev + 1))
    return out


def summarise(value: object, describe: Callable[[object], str | None] = lambda v: None, depth: int = 0) -> str:
    """A short text for a value. Never iterates anything but a list, tuple, set or dict,
    so a one-shot iterator passed to the engine stays intact."""
    d = describe(value)
    if d is not None:
        return d
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, list | tuple | set | frozenset):
        if depth >= 2:
            return f"{type(value).__name__}[{len(value)}]"
        items = [summarise(v, describe, depth + 1) for v in itertools.islice(value, 5)]
        more = f", ... {len(value)} items" if len(value) > 5 else ""
        brackets = {list: "[]", tuple: "()"}.get(type(value), "{}")
        return f"{brackets[0]}{', '.join(items)}{more}{brackets[1]}"
    if isinstance(value, dict):
        return f"{{{len(value)} items}}"
    return type(value).__name__


class _Script:
    """The calls since attach as statements, up to a limit (beyond it: not replayable)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.lines: list[str] = []
        self.broken = "" if limit > 0 else "reproductions are off (script_limit=0)"

    def add(self, statement: str | None, call: str) -> None:
        if self.broken:
            return
        if statement is None:
            self.broken = f"{call} cannot be written as a statement"
        elif len(self.lines) >= self.limit:
            self.broken = f"more than {self.limit} calls were made (script_limit)"
            self.lines = []
        else:
            self.lines.append(statement)


def _check_settings(mode: str, **counts: tuple[int, int]) -> None:
    """ValueError, naming the setting, for a mode that is neither, or a count (value,
    least) below its least or not an integer."""
    if mode not in ("raise", "record"):
        hint = " (the pytest plugin's and KVORACLE_SHADOW's 'report' is mode='record')" if mode == "report" else ""
        raise ValueError(f"mode must be 'raise' or 'record', not {mode!r}{hint}")
    for name, (value, least) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer of at least {least}, not {value!r}")


def _calls(n: int) -> str:
    return "no earlier call" if n == 0 else "the last call" if n == 1 else f"the last {n} calls"


class Shadow:
    """One attached engine object: its wrappers, ring buffer, checks and alarms."""

    def __init__(self, observer: Observer, *, engine_spec: str, mode: Mode = "raise", interval: int = 1,
                 full_every: int = 1000, incremental: bool = True, history: int = 20, ring: int = 1000,
                 gap: int = 8, report_dir: str | Path | None = None, script_limit: int = 10_000,
                 tally: Tally | None = None) -> None:
        _check_settings(mode, interval=(interval, 1), full_every=(full_every, 0), history=(history, 0),
                        ring=(ring, 1), gap=(gap, 0), script_limit=(script_limit, 0))
        self.observer = observer
        self.engine_spec = engine_spec
        self.mode: Mode = mode
        self.interval = interval
        self.full_every = full_every
        self.incremental = incremental
        self.history_size = history
        self.ring: deque[Call] = deque(maxlen=ring)
        self.gap = gap
        self.report_dir = Path(report_dir or os.environ.get(ENV_DIR) or Path(tempfile.gettempdir()) / "kvoracle-shadow")
        self.own = Tally()
        self.tallies = [self.own] if tally is None or tally is self.own else [self.own, tally]
        self._count("engines")
        self.alarms: list[Alarm] = []  # this object's
        self.seen: set[tuple[str, str]] = set()
        self.active = True
        self.calls = 0
        self._since_full = 0
        self._stale = False  # a call raised: the observer's bookkeeping may be behind
        self._seen_views: dict[range, View] = {}  # this call's incremental views, by range
        self.streak = liveness.Streak()  # the latest scheduling steps in a row that stalled, stood still
        self.furthest: dict[str, int] = {}  # request -> the most tokens it was seen computed
        self._streaking: set[str] = set()  # the IDs the current streak broke (reported once per streak)
        self._local = threading.local()
        self._wrapped: list[tuple[object, str, object]] = []  # (object, name, what was there)
        self._rebuild = self._safely(observer.reproduction, None)
        self._script = _Script(script_limit if self._rebuild is not None else 0)
        if self._rebuild is None and script_limit:
            self._script.broken = f"the {observer.engine} observer cannot rebuild this engine"
        self._ids = observer.ids()
        first = self._safely(observer.observe, None)  # the engine as shadow finds it
        gaps = [] if first is None else observation_gaps({"GPU": first})
        for t in self.tallies:
            t.unchecked[observer.engine] = (*(what for part, what in WITHOUT if part in lacking(type(observer))), *gaps)
        if not self._script.broken and not (first is not None and self._fresh(first)):
            self._script.broken = "shadow attached to an engine already in use (a replay starts from a fresh one)"
        self._reports = 0
        for label, obj, names in observer.targets():
            for name in names:
                if callable(getattr(obj, name, None)):
                    self._wrap(label, obj, name)

    def _fresh(self, o: Observation) -> bool:
        """The engine, observed as `o`, is as its preamble builds it: nothing held, cached or missing."""
        return not o.tables and not o.cached and set(o.free or ()) == set(self._ids)

    # -- wrapping ------------------------------------------------------------------------

    def _wrap(self, label: str, obj: object, name: str) -> None:
        original = getattr(obj, name)
        instance = getattr(obj, "__dict__", {})
        self._wrapped.append((obj, name, instance.get(name, _MISSING)))
        local, shadow = self._local, self

        @functools.wraps(original)
        def wrapper(*args: object, **kwargs: object) -> object:
            if getattr(local, "depth", 0) or not shadow.active:
                return original(*args, **kwargs)
            local.depth = 1
            try:
                call = Invocation(label, name, args, kwargs)
                noted = shadow._before(call)
                try:
                    result = original(*args, **kwargs)
                except BaseException as error:
                    shadow._raised(call, noted, error)
                    raise
                shadow._returned(call, noted, result)
                return result
            finally:
                local.depth = 0

        setattr(obj, name, wrapper)

    def detach(self) -> None:
        """Put the engine's methods back; the object runs as if never attached."""
        self.active = False
        for obj, name, was in reversed(self._wrapped):
            if was is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, was)
        self._wrapped.clear()

    def __enter__(self) -> Shadow:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.audit()
        finally:
            self.detach()

    # -- around each outermost call ----------------------------------------------------

    def _safely(self, f: Callable[..., _T], default: _T, *args: object) -> _T:
        """Run shadow's own work; an error in it is noted and never reaches the engine."""
        try:
            return f(*args)
        except ShadowAlarm:
            raise
        except Exception as e:  # noqa: BLE001 - shadow must not break the engine
            for t in self.tallies:
                if len(t.internal) < 100:
                    t.internal.append(f"{type(e).__name__}: {e}")
            return default

    def _before(self, call: Invocation) -> _Noted:
        token = self._safely(self.observer.before, None, call)
        statement = None if self._script.broken else self._safely(self.observer.statement, None, call)
        exiting = self._safely(self.observer.exiting, None, call)
        before = None if exiting is None else self._safely(self._exit_before, None, exiting)
        args = self._safely(summarise_args, "?", call, self.observer.describe)
        step = self._safely(self._step_before, None, call)
        return _Noted(token, args, statement, before, step)

    def _record(self, call: Invocation, noted: _Noted, outcome: str, blocks: frozenset[int] | None) -> Call:
        self.calls += 1
        self._count("calls")
        entry = Call(self.calls, call.name, noted.args, outcome, blocks, _context)
        self.ring.append(entry)
        statement = noted.statement
        if statement is not None and outcome.startswith("raised"):
            statement = f"with suppress(Exception):  # {outcome}\n" + "\n".join(
                "    " + line for line in statement.splitlines())
        self._script.add(statement, call.name)
        return entry

    def _raised(self, call: Invocation, noted: _Noted, error: BaseException) -> None:
        def judge() -> None:
            self._stale = True  # the observer did not see this call end: its index may be behind
            entry = self._record(call, noted, f"raised {type(error).__name__}: {str(error)[:80]}", None)
            found = self.observer.on_raise(call, error)
            if noted.exit is not None:  # an exit path that raised: did the request give back its blocks?
                request, _, before = noted.exit
                after = self._view(self.observer.observe())
                self._count("full")
                for b in before:
                    found += liveness.live_exit(b, after, request)
            new = self._alarms(found, entry, "raise", frozenset())
            if new and isinstance(error, Exception):
                for a in new:
                    error.add_note(f"kvoracle shadow: {a.report()}")

        self._safely(judge, None)

    def _returned(self, call: Invocation, noted: _Noted, result: object) -> None:
        none: list[Alarm] = []
        new = self._safely(self._judge, none, call, noted, result)
        if new and self.mode == "raise":
            raise ShadowAlarm(new)

    def _count(self, what: str, n: int = 1) -> None:
        for t in self.tallies:
            setattr(t, what, getattr(t, what) + n)

    def _judge(self, call: Invocation, noted: _Noted, result: object) -> list[Alarm]:
        self._seen_views.clear()
        touched = self.observer.after(call, noted.token, result)
        blocks = None if touched is None else frozenset(touched)
        entry = self._record(call, noted, "-> " + summarise(result, self.observer.describe), blocks)
        self._since_full += 1
        found: list[Violation] = []
        how = ""
        incremental = self.incremental and not self._stale and blocks is not None
        if incremental and blocks:
            inc = self._incremental(blocks)
            if inc is None:
                incremental = False
            else:
                self._count("incremental")
                how = "incremental"
                if inc:  # confirmed on the full view before anyone hears of it
                    found = self._full()
                    if not found:
                        self._count("unconfirmed")
        if not incremental and (self._stale or self._since_full >= self.interval):
            found, how = self._full(), "full"
        elif self.full_every and self._since_full >= self.full_every:
            found, how = found + self._full(), how or "full"
        if noted.exit is not None:
            request, runs, before = noted.exit
            after = self._exit_after(runs)
            if after is not None:
                for b, a in zip(before, after):
                    found += liveness.live_exit(b, a, request)
                how = how or "exit"
        stepped = self._safely(self._steps, None, call, noted.step)
        if stepped is not None:
            found, how = found + stepped, how or "step"
        if how:
            self._count("checked")
        return self._alarms(found, entry, how or "full", blocks or frozenset())

    def _step_before(self, call: Invocation) -> Progress | None:
        if not self.observer.scheduling(call):
            return None
        now = self.observer.progress()
        if now is not None:
            self.furthest = liveness.most_computed(self.furthest, now.view)
        return now

    def _steps(self, call: Invocation, before: Progress | None) -> list[Violation] | None:
        """LIVE-ADMIT and LIVE-PROGRESS after a scheduling step (None: the call was none;
        a call between steps only moves the streak on)."""
        now = self.observer.progress()
        if now is None:
            return None
        if before is None:
            # as the machine sees an engine before each call
            self.furthest = liveness.most_computed(self.furthest, now.view)
            keeps = self.observer.keeps_progress(call)
            self.streak = liveness.between(self.streak, keeps, bool(now.view.computed))
            self._streaking &= {v.id for v in liveness.streak_violations(self.streak)}
            return None
        self._count("steps")
        self.streak = liveness.scheduled(self.streak, before.view, now.view, before.needs, before.growth,
                                         before.room, (before.in_flight, now.in_flight), self.furthest)
        self.furthest = liveness.most_computed(self.furthest, now.view)
        found = liveness.streak_violations(self.streak)
        new = [v for v in found if v.id not in self._streaking]
        self._streaking = {v.id for v in found}
        self.streak = liveness.judged(self.streak)  # each streak is reported once: keep no more
        return new

    def _full(self) -> list[Violation]:
        self._count("full")
        self._since_full = 0
        self._stale = False
        return invariants.check(self._view(self.observer.observe()))

    def _view(self, o: Observation) -> View:
        return view_of(o, block_size=self.observer.block_size)

    def _incremental(self, blocks: frozenset[int]) -> list[Violation] | None:
        """spec's invariants on the observation cut to the changed blocks; None: the
        observer cannot do it here (or a block outside its ids changed)."""
        ids = self._ids
        if any(b not in ids for b in blocks):
            return None
        found: list[Violation] = []
        self._seen_views.clear()
        for run in _runs(blocks, self.gap):
            o = self.observer.observe_range(run)
            if o is None:
                return None
            view = self._seen_views[run] = self._view(o)
            found += invariants.check(view)
        return found

    def _ranges(self, runs: list[range]) -> list[View] | None:
        """Views of these ranges (the ones the incremental check just built are reused)."""
        views: list[View] = []
        for r in runs:
            v = self._seen_views.get(r)
            if v is None:
                o = self.observer.observe_range(r)
                if o is None:
                    return None
                v = self._view(o)
            views.append(v)
        return views

    def _exit_before(self, request: str) -> tuple[str, list[range] | None, list[View]] | None:
        """LIVE-EXIT's "before": views over the request's blocks (cut to runs when the
        observer can), else the full view when every call is checked in full anyway."""
        if self.incremental and not self._stale:
            runs = _runs((b for b in self.observer.table(request) if b in self._ids), self.gap)
            views = self._ranges(runs)
            if views is not None:
                return request, runs, views
        if self.interval > 1:
            return None  # no full views at every exit: INV-CONSERVE at the next full check covers it
        return request, None, [self._view(self.observer.observe())]

    def _exit_after(self, runs: list[range] | None) -> list[View] | None:
        return [self._view(self.observer.observe())] if runs is None else self._ranges(runs)

    # -- alarms --------------------------------------------------------------------------

    def _alarms(self, found: Sequence[Violation], entry: Call, check: str, touched: frozenset[int]) -> list[Alarm]:
        new: list[Alarm] = []
        for v in invariants.by_severity(list(found)):
            key = (v.id, v.message)
            if key in self.seen:
                continue
            self.seen.add(key)
            named = _named_blocks(v.message) or set(touched)
            alarm = Alarm(v, self.observer.engine, tuple(sorted(named)), entry, self._history(named), None, check)
            new.append(alarm)
        if new:
            path = self._safely(self._reproduce, None, new, entry)
            new = [replace(a, reproduction=path) for a in new]
            self.alarms += new[:max(0, MAX_ALARMS - len(self.alarms))]
            for t in self.tallies:  # every alarm is counted; the first MAX_ALARMS are kept
                t.alarms += new[:max(0, MAX_ALARMS - len(t.alarms))]
                t.by_id.update(a.id for a in new)
        return new

    def _history(self, blocks: Collection[int]) -> tuple[Call, ...]:
        """The last calls that touched `blocks` (a call that could not say counts), oldest first."""
        out: list[Call] = []
        for c in reversed(self.ring):
            if not blocks or c.blocks is None or not c.blocks.isdisjoint(blocks):
                out.append(c)
                if len(out) >= self.history_size:
                    break
        return tuple(reversed(out))

    def _reproduce(self, alarms: Sequence[Alarm], entry: Call) -> str | None:
        if self._rebuild is None or self._reports >= 20 or not self._script.limit:  # 0: off (a replay's own)
            return None
        self._reports += 1
        preamble, target = self._rebuild
        self.report_dir.mkdir(parents=True, exist_ok=True)
        path = self.report_dir / f"{self.observer.engine}-{os.getpid()}-{id(self):x}-{self._reports}.py"
        when = f"at the {entry}" if entry.audit else f"after call #{entry.seq} {entry.name}"
        head = [f"# kvoracle shadow reproduction: {self.observer.engine}, {when}",
                *(f"# {a.id}: {a.message}" for a in alarms)]
        if self._script.broken:
            head += [f"# Not a full replay: {self._script.broken}.",
                     "# It rebuilds the engine and checks it; the last calls shadow saw were:",
                     *(f"#   {c}" for c in self.ring)]
            body: list[str] = []
        else:
            head.append(f"# Replays the {len(self._script.lines)} calls made since shadow attached; "
                        f"expect ShadowAlarm {alarms[0].id}.")
            body = self._script.lines
        attach_line = (f"shadow = kvoracle.shadow.attach({target}, engine={self.engine_spec!r}, mode='raise', "
                       f"interval=1, full_every=1, script_limit=0)")
        text = "\n".join([*head, "", "from contextlib import suppress", "", preamble.rstrip(), "",
                          "import kvoracle.shadow", "", attach_line, *body,
                          "shadow.audit()", "print('kvoracle shadow: the replay raised no alarm')", ""])
        path.write_text(text)
        return str(path)

    # -- audits and reports ----------------------------------------------------------------

    def audit(self) -> list[Alarm]:
        """A full check now, plus LIVE-DRAIN when nothing is live (reclaimable blocks
        count as freed: the drain's eviction would free them). Raises in "raise" mode."""
        last = self.ring[-1] if self.ring and self.ring[-1].seq == self.calls else None
        follows = "" if last is None else f"{last.name}({last.args}) {last.outcome}"
        entry = Call(self.calls, "audit", follows, "", None, _context, audit=True)
        if not self._wrapped and not self.active:
            return []

        def run() -> list[Alarm]:
            found = self._full()
            if self.observer.quiescent():
                o = self.observer.observe()
                drained = replace(o, free=(o.free or ()) + (o.evictable or ()), evictable=())
                found += liveness.drained(self._view(drained))
            else:
                self._undrained(entry.where)
            return self._alarms(found, entry, "audit", frozenset())

        none: list[Alarm] = []
        new = self._safely(run, none)
        if new and self.mode == "raise":
            raise ShadowAlarm(new)
        return new

    def _undrained(self, where: str) -> None:
        """Note an audit that could not judge LIVE-DRAIN: the holders of blocks it found."""
        holders = sorted(map(str, self.observer.observe().tables or {}))
        if not holders:  # an observer that never judges the drain (a scheduler's: its manager's does)
            return
        named = ", ".join(holders[:4]) + (f" and {len(holders) - 4} more" if len(holders) > 4 else "")
        for t in self.tallies:
            if len(t.undrained) < 100:
                t.undrained.append(f"{where or 'the audit'}: still held by {named}")

    def history(self) -> list[Call]:
        return list(self.ring)

    @property
    def tally(self) -> Tally:
        """What shadow did on this object."""
        return self.own

    def summary(self) -> str:
        return self.own.summary(self.observer.engine)


@dataclass(frozen=True)
class _Noted:
    token: object
    args: str
    statement: str | None
    exit: tuple[str, list[range] | None, list[View]] | None
    step: Progress | None  # the engine before a scheduling step


def summarise_args(call: Invocation, describe: Callable[[object], str | None]) -> str:
    parts = [summarise(a, describe) for a in call.args]
    parts += [f"{k}={summarise(v, describe)}" for k, v in call.kwargs.items()]
    return ", ".join(parts)


# --- the API ----------------------------------------------------------------------------


def observer_class(engine: str | type) -> type:
    """An observer class: a name from ENGINES, `module:Class`, `path/file.py:Class`, or a class."""
    if isinstance(engine, type):
        return engine
    spec = ENGINES.get(engine, engine)
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"unknown shadow engine {engine!r}: use one of {', '.join(ENGINES)}, MODULE:CLASS "
                         f"or FILE.py:CLASS")
    if where.endswith(".py"):
        path = Path(where).resolve()
        module_name = f"_kvoracle_shadow_{path.stem}"
        module = sys.modules.get(module_name)
        if module is None:
            loaded = importlib.util.spec_from_file_location(module_name, path)
            if loaded is None or loaded.loader is None:
                raise ValueError(f"no observer file {where}")
            module = importlib.util.module_from_spec(loaded)
            sys.modules[module_name] = module
            loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{where} has no observer class {name}")
    if not all(callable(getattr(cls, part, None)) for part in ("targets", "observe")):
        raise ValueError(f"{where}:{name} is not an observer: it has no targets() and observe() (an observer "
                         "wraps the engine's class, it is not the engine's class; docs/shadow.md, 'Your own "
                         "engine: an observer')")
    return cls


def engine_spec(engine: str | type) -> str:
    """How a reproduction file names the observer again: its ENGINES name, MODULE:CLASS
    for a class in a package, else FILE.py:CLASS."""
    if isinstance(engine, str):
        return engine
    here = f"{engine.__module__}:{engine.__qualname__}"
    for name, spec in ENGINES.items():
        if spec == here:
            return name
    if "." in engine.__module__ and not engine.__module__.startswith("_kvoracle_shadow_"):
        return here
    return f"{inspect.getfile(engine)}:{engine.__qualname__}"


def attach(obj: object, engine: str | type, *, mode: Mode = "raise", interval: int = 1,
           full_every: int = 1000, incremental: bool = True, history: int = 20, ring: int = 1000, gap: int = 8,
           report_dir: str | Path | None = None, script_limit: int = 10_000, tally: Tally | None = None) -> Shadow:
    """Attach shadow checks to a live engine object (see the module's docstring).

    mode        "raise": ShadowAlarm after the call that broke a property (tests);
                "record": keep the alarm in `.alarms` and go on (serving)
    interval    without incremental support, a full check every `interval` calls
    full_every  a full audit every `full_every` calls even with incremental checks (0: only at the end)
    history     how many past calls an alarm shows; ring: how many the buffer keeps
    gap         changed blocks closer than this are checked as one range of ids
    script_limit  calls kept as statements for the reproduction file (0: no reproduction file)
    """
    known = _attached.get(id(obj))
    existing = known() if known is not None else None
    if existing is not None and existing.active:
        return _again(existing, engine, mode)
    cls = observer_class(engine)
    try:
        observer = cast(Observer, cls(obj))
    except (AttributeError, TypeError) as e:
        watches = ", ".join(getattr(cls, "classes", ())) or "its engine's objects"
        raise TypeError(f"the {engine_spec(engine)} observer cannot attach to this {type(obj).__name__} object "
                        f"({type(e).__name__}: {e}); it attaches to {watches}") from e
    shadow = Shadow(observer, engine_spec=engine_spec(engine), mode=mode, interval=interval, full_every=full_every,
                    incremental=incremental, history=history, ring=ring, gap=gap, report_dir=report_dir,
                    script_limit=script_limit, tally=tally)
    if len(_attached) > 1000:  # forget objects that are gone
        for key in [k for k, ref in _attached.items() if ref() is None]:
            del _attached[key]
    _attached[id(obj)] = weakref.ref(shadow)
    return shadow


def _again(existing: Shadow, engine: str | type, mode: Mode) -> Shadow:
    """A second attach to an object already attached (by the pytest plugin, `install`, or
    the caller): the same shadow, made to raise if this caller asks it to; another
    engine's observer on the same object is refused."""
    if engine_spec(engine) != existing.engine_spec:
        raise ValueError(f"this object is already attached with the {existing.engine_spec!r} observer, not "
                         f"{engine_spec(engine)!r}: detach() that shadow first")
    _check_settings(mode)
    if mode == "raise":
        existing.mode = mode
    return existing


# --- attaching to every engine object a process creates ---------------------------------


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback on a module right after it is first imported."""

    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _LoaderThen(spec.loader, self.callback)
        return spec


class _LoaderThen(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, then: Callable[[types.ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> object:  # resource readers and the like
        return getattr(self.loader, name)


@dataclass
class _Install:
    engine: str
    make: Callable[[object], Shadow]
    tally: Tally
    sessions: list[Shadow] = field(default_factory=list)  # strong: until their audit
    undo: list[Callable[[], None]] = field(default_factory=list)

    def new_object(self, obj: object) -> None:
        try:
            self.sessions.append(self.make(obj))
        except Exception as e:  # noqa: BLE001 - never break the engine's construction
            self.tally.internal.append(f"attach to {type(obj).__name__}: {type(e).__name__}: {e}")

    def audit(self) -> None:
        """The end-of-run audit of every object attached so far; then let them go."""
        sessions, self.sessions = self.sessions, []
        for s in sessions:
            if s.active:
                try:
                    s.audit()
                except ShadowAlarm:
                    pass  # recorded in the tally either way


_installs: dict[str, _Install] = {}


def _missing(module: str) -> bool:
    """Whether `module`'s package is absent from this Python: not imported, and no finder
    finds it (the install's own finders, which would take themselves off, are skipped)."""
    if module in sys.modules:
        return False
    top = module.partition(".")[0]
    if top in sys.modules:
        return False
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if isinstance(finder, _AfterImport) or find is None:
            continue
        try:
            if find(top, None) is not None:
                return False
        except Exception:  # noqa: BLE001 - a finder's own trouble: it does not find it
            continue
    return True


def _hook_class(path: str, on_new: Callable[[object], None], unfound: list[str]) -> Callable[[], None]:
    """Call `on_new(obj)` after each construction of exactly that class; returns the undo.
    A module without that class gets no hook: `unfound` says so (the import goes on)."""
    module_name, _, qualname = path.partition(":")
    undo: list[Callable[[], None]] = []

    def patch(module: types.ModuleType) -> None:
        cls: object = module
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
        if not isinstance(cls, type):
            unfound.append(f"{path} ({module_name} has no class {qualname})")
            return
        had = cls.__dict__.get("__init__", _MISSING)
        init: Callable[..., None] = getattr(cls, "__init__")  # its own or inherited

        @functools.wraps(init)
        def __init__(self: object, *args: object, **kwargs: object) -> None:
            init(self, *args, **kwargs)
            if type(self) is cls:
                on_new(self)

        type.__setattr__(cls, "__init__", __init__)

        def restore() -> None:
            if had is _MISSING:
                type.__delattr__(cls, "__init__")
            else:
                type.__setattr__(cls, "__init__", had)

        undo.append(restore)

    if module_name in sys.modules:
        patch(sys.modules[module_name])
    else:
        finder = _AfterImport(module_name, patch)
        sys.meta_path.insert(0, finder)
        undo.append(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)

    def undo_all() -> None:
        for u in reversed(undo):
            u()

    return undo_all


def install(engine: str | type, *, mode: Mode = "record", interval: int = 1, full_every: int = 1000,
            incremental: bool = True, history: int = 20, ring: int = 1000, gap: int = 8,
            report_dir: str | Path | None = None, script_limit: int = 10_000, tally: Tally | None = None) -> Tally:
    """Attach (as `attach` does, with these options) to every object of the observer's
    engine classes created from now on, including when their module is imported later.
    Returns the tally they share."""
    spec = engine_spec(engine)
    if spec in _installs:
        return _installs[spec].tally
    cls = observer_class(engine)
    shared = tally if tally is not None else Tally()

    def make(obj: object) -> Shadow:
        return attach(obj, cls, mode=mode, interval=interval, full_every=full_every, incremental=incremental,
                      history=history, ring=ring, gap=gap, report_dir=report_dir, script_limit=script_limit,
                      tally=shared)

    classes = tuple(getattr(cls, "classes", ()))
    if not classes:
        raise ValueError(f"the {spec} observer names no engine class to attach to (classes = "
                         "('module:Class', ...))")
    inst = _Install(spec, make, shared)
    for path in classes:
        shared.watching.append(path)  # said in the summary if its package is missing then
        inst.undo.append(_hook_class(path, inst.new_object, shared.unfound))
    _installs[spec] = inst
    return shared


def uninstall(engine: str | type | None = None) -> None:
    """Stop attaching to new objects (objects already attached stay attached)."""
    for spec in [engine_spec(engine)] if engine is not None else list(_installs):
        inst = _installs.pop(spec, None)
        if inst is not None:
            for u in reversed(inst.undo):
                u()


def _parse_env(value: str) -> tuple[str, Mode]:
    engine, _, rest = value.partition(",")
    flags = {f.strip() for f in rest.split(",") if f.strip()}
    unknown = flags - {"report", "record", "raise"}
    if unknown or not all(_engines(engine)):
        raise ValueError(f"{ENV}={value!r}: want ENGINE[+ENGINE...][,report]")
    return engine.strip(), "record" if flags & {"report", "record"} else "raise"  # the API's word is as good


def _engines(engines: str) -> list[str]:
    """The observers a `+`-joined list names (vllm+vllm-scheduler: the blocks and the steps)."""
    return [e.strip() for e in engines.split("+")]


def install_all(engines: str, mode: Mode, history: int = 20, interval: int = 1,
                report_dir: str | Path | None = None) -> tuple[Tally, list[_Install], str]:
    """`install` each observer of a `+`-joined list, sharing one tally; with the installs
    and a name for the summary."""
    names = _engines(engines)
    tally = install(names[0], mode=mode, history=history, interval=interval, report_dir=report_dir)
    for engine in names[1:]:
        install(engine, mode=mode, history=history, interval=interval, report_dir=report_dir, tally=tally)
    insts = [_installs[engine_spec(e)] for e in names]
    return tally, insts, "+".join(str(getattr(observer_class(e), "engine", e)) for e in names)


def install_from_env(environ: Mapping[str, str] | None = None) -> Tally | None:
    """`KVORACLE_SHADOW=ENGINE[+ENGINE...][,report]`: install for this process; audit and
    print the summary to stderr at exit."""
    global _at_exit
    value = (environ if environ is not None else os.environ).get(ENV, "")
    if not value:
        return None
    engines, mode = _parse_env(value)
    tally, insts, name = install_all(engines, mode=mode)
    shown: set[int] = set()  # the alarms an uncaught ShadowAlarm printed (before atexit runs)
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
        if isinstance(value, ShadowAlarm):
            shown.update(map(id, value.alarms))
        previous(kind, value, tb)

    def at_exit() -> None:
        for inst in insts:
            inst.audit()
        print(tally.summary(name, shown=shown), file=sys.stderr)

    sys.excepthook = hook
    atexit.register(at_exit)
    _at_exit = (at_exit, tally, mode)
    return tally


# the summary install_from_env prints at exit, its tally and mode (python -m kvoracle.shadow
# prints it itself, and exits with the verdict)
_at_exit: tuple[Callable[[], None], Tally, Mode] | None = None


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """python -m kvoracle.shadow's own options, and the program with its arguments: from
    `-m MODULE` or the first word that is no option on, every word is the program's (as
    python itself reads its command line)."""
    for i, word in enumerate(argv):
        if word == "-m":
            return list(argv[:i + 2]), list(argv[i + 2:])
        if word == "--":
            return list(argv[:i]), list(argv[i + 1:])
        if not word.startswith("-") and (i == 0 or argv[i - 1] != "--engine"):
            return list(argv[:i]), list(argv[i:])
    return list(argv), []


def _runnable(module: str | None, rest: Sequence[str]) -> str:
    """Why the program cannot be run ('' when it can)."""
    if module is not None:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as e:
            return f"no module {module!r} ({e})"
        return "" if found is not None else f"no module named {module!r} on this Python's path"
    if not rest:
        return "nothing to run: -m MODULE or SCRIPT"
    return "" if os.path.isfile(rest[0]) else f"no such file: {rest[0]}"


def main(argv: Sequence[str] | None = None) -> int:
    """python -m kvoracle.shadow [--engine E] [--report] (-m MODULE | SCRIPT) [ARGS...]

    Runs the program with shadow attached to every engine object it creates, then audits
    them and prints the summary. Exit status: the program's own when it is not 0; else 1
    when there was an alarm (unless --report or KVORACLE_SHADOW's ',report') or when an
    engine it was asked to watch is not there; else 0."""
    import argparse

    own, rest = _split(sys.argv[1:] if argv is None else argv)
    usage, _, description = (main.__doc__ or "").partition("\n\n")
    p = argparse.ArgumentParser(prog="python -m kvoracle.shadow", usage=usage,
                                description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", help=f"the observer (default: ${ENV}); one of {', '.join(ENGINES)} or MODULE:CLASS; "
                                    "several joined by + (vllm+vllm-scheduler)")
    p.add_argument("--report", action="store_true", help="record alarms and go on (default: raise)")
    p.add_argument("-m", dest="module", help="run a module as __main__ (every word after it is its argument)")
    a = p.parse_args(own)
    if a.engine:
        os.environ[ENV] = a.engine + (",report" if a.report else "")
    if not os.environ.get(ENV):
        p.error(f"name the engine: --engine or {ENV}")
    try:
        first = _engines(_parse_env(os.environ[ENV])[0])[0]
        if not any(i.engine == engine_spec(first) for i in _installs.values()):
            install_from_env()
    except (ValueError, ImportError) as e:
        _cancel_summary()
        p.error(str(e))
    why = _runnable(a.module, rest)  # after the install: finding a module imports its package
    if why:
        _cancel_summary()
        p.error(why)
    status = _run(a.module, rest)
    return status or _verdict()


def _run(module: str | None, rest: Sequence[str]) -> int:
    """Run the program as __main__; its exit status (SystemExit's), 0 when it returns."""
    import runpy

    try:
        if module is not None:
            sys.argv = [module, *rest]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(rest)
            runpy.run_path(rest[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _cancel_summary() -> None:
    """No summary at exit: the program never ran."""
    if _at_exit is not None:
        atexit.unregister(_at_exit[0])


def _verdict() -> int:
    """Print the summary now (not at exit) and give the exit status it calls for."""
    if _at_exit is None:
        return 0
    summary, tally, mode = _at_exit
    atexit.unregister(summary)
    summary()
    return 1 if (tally.alarms and mode == "raise") or tally.misconfigured else 0


# --- the pytest plugin (pytest --kvoracle-shadow ENGINE; its options: kvoracle.pytest_plugin) ---


def pytest_addoption(parser: pytest.Parser) -> None:
    from kvoracle.pytest_plugin import shadow_options

    try:
        shadow_options(parser)
    except ValueError:  # kvoracle's autoloaded plugin has added them (this module came in later)
        pass


def pytest_configure(config: pytest.Config) -> None:
    engine = config.getoption("kvoracle_shadow", None)
    if engine and not config.pluginmanager.has_plugin(_SESSION):  # one session plugin, whichever plugin starts it
        import pytest

        try:
            _writable(config.getoption("kvoracle_shadow_dir"))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        try:
            plugin = _Plugin(config, str(engine))
        except (ValueError, ImportError) as e:
            raise pytest.UsageError(f"--kvoracle-shadow {engine}: {e}") from None
        config.pluginmanager.register(plugin, _SESSION)


_SESSION = "kvoracle-shadow-session"


def _writable(folder: str | None) -> None:
    """ValueError unless reproduction files can be written in `folder` (made if missing):
    said before the session, not first at an alarm."""
    if folder is None:
        return
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--kvoracle-shadow-dir {folder}: no folder can be made there ({e.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--kvoracle-shadow-dir {folder}: no file can be made in it (not writable)")


class _Plugin:
    def __init__(self, config: pytest.Config, engine: str) -> None:
        self.engine = engine
        self.report_only = bool(config.getoption("kvoracle_shadow_report"))
        self.tally, self.insts, self.name = install_all(
            engine, mode="record", history=config.getoption("kvoracle_shadow_history"),
            interval=config.getoption("kvoracle_shadow_interval"), report_dir=config.getoption("kvoracle_shadow_dir"))

    def audit(self) -> None:
        for inst in self.insts:
            inst.audit()

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        global _context
        _context = item.nodeid

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        global _context
        _context = nodeid
        self.audit()  # the full audit at the end of each test, of what it created
        _context = ""

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.audit()
        if (self.tally.alarms or self.tally.misconfigured) and not self.report_only:
            import pytest

            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section("kvoracle shadow")
        for line in self.tally.summary(self.name).splitlines():
            terminalreporter.write_line(line)
        if self.report_only:
            return
        if self.tally.alarms:
            terminalreporter.write_line("the session fails on these alarms (--kvoracle-shadow-report: only report)")
        elif self.tally.misconfigured:
            terminalreporter.write_line("the session fails: an engine it was to watch is not there, as the lines "
                                        "above say (--kvoracle-shadow-report: only report)")

    def pytest_unconfigure(self) -> None:
        for engine in _engines(self.engine):
            uninstall(engine)


if os.environ.get(ENV) and __name__ != "__main__":
    try:
        install_from_env()
    except (ValueError, ImportError) as _bad:  # a bad KVORACLE_SHADOW: a usage error, not a traceback
        print(f"kvoracle shadow: {_bad}", file=sys.stderr)
        raise SystemExit(2) from None

if __name__ == "__main__":
    from kvoracle import shadow as _imported  # the installed copy, where the hooks live

    sys.exit(_imported.main())
