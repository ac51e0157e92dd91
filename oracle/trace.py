"""Traces: a versioned JSON Lines record of an engine's lifecycle events and observed states.

An engine that cannot be driven from Python writes one; `kvoracle check-trace FILE`
replays it through spec/'s actions and reports the first violation with the shortest
prefix of the trace that shows it. The format is documented in docs/trace.md.

    line 1   {"format": "kvoracle-trace", "version": 3, "level": "cache"|"scheduler", ...}
    then     one event per line: {"op": ..., <arguments>, "observe": {...}?}

A cache-level trace carries the cache's actions (match, allocate, commit, release,
evict, complete, reset); a scheduler-level trace the system's (submit, admit, prefill,
decode, insert, exit, evict, complete, tick, reset), so that its clock is known. Every
event is a spec action with the choices the engine made; `observe` (optional, on any
event) is what the engine reports of its state after the event, and replaces the
specification's own value before spec's properties are evaluated. After every event:
every safety property; after every release or exit: LIVE-EXIT; on a scheduler trace,
before every tick and at its end: LIVE-TRANSFER on the trace's own clock (a tick's
timeouts follow it as `complete` events of their own, so the check waits for them);
at each `scheduled` line (it closes the scheduling step a `schedule` line opened):
LIVE-ADMIT and LIVE-PROGRESS on that step.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Mapping, TextIO, TypeGuard, cast

from kvoracle.kvcache.abstraction import abstract, kept_counters
from kvoracle.kvcache.faults import FaultyCopier, FaultyStorage, ScriptedFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import actions, liveness, scheduler
from kvoracle.spec.actions import (
    Allocate,
    CacheEvent,
    Commit,
    Complete,
    Drop,
    Evict,
    EvictCpu,
    EvictStep,
    Match,
    PreconditionError,
    Release,
    Reset,
    SkipStale,
    SwapOutTo,
)
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation, by_severity, check
from kvoracle.spec.scheduler import Admit, Decode, Event, Exit, Insert, Prefill, Submit, Tick
from kvoracle.spec.state import CacheState, Heap, Status, System, initial, initial_system
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    Error,
    GpuBlock,
    Ok,
    Outcome,
    Partial,
    RequestId,
    Tier,
    Timeout,
    TransferId,
)
from kvoracle.spec.view import View, of_cache, request_name, true_counters, with_kept_counters

FORMAT, VERSION = "kvoracle-trace", 3
Json = dict[str, object]


class TraceFormatError(Exception):
    """A trace line that is not valid JSON or not a known event; names the line."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")
        self.line = line


@dataclass(frozen=True)
class TraceReport:
    events: int
    violations: list[Violation]
    line: int  # the file's line of the first violating event (0: none)
    prefix: list[str]  # the trace's lines up to and including that one (blank lines too, as "")
    unfinished: str = ""  # of a trace that passed: what it leaves unjudged by ending mid-run (`unfinished`)
    unchecked: tuple[str, ...] = ()  # of a trace that passed: the properties it carries nothing for (`unreported`)

    @property
    def passed(self) -> bool:
        return not self.violations


# --- decoding -----------------------------------------------------------------------------------

# Each op's fields: (required, optional). Every event may also carry `observe`, and any field
# whose name starts with "_" (the engine's own note: a timestamp, a step number) is ignored;
# any other field is a format error, so that a misspelt one (`obsreve`) is not silently
# ignored along with what it would have checked.
Fields = tuple[frozenset[str], frozenset[str]]


def _fields(required: str = "", optional: str = "") -> Fields:
    return frozenset(required.split()), frozenset(optional.split())


SHARED_FIELDS = {"evict": _fields("steps"), "complete": _fields("transfer outcome"), "reset": _fields()}
CACHE_FIELDS = {
    "match": _fields("request", "hashes swap_dests prefetch_dests limit"),
    "allocate": _fields("request blocks"),
    "commit": _fields("request hashes"),
    "release": _fields("request", "writes"),
    **SHARED_FIELDS,
}
SCHEDULER_FIELDS = {
    "submit": _fields("request tokens"),
    "admit": _fields("request", "swap_dests prefetch_dests"),
    "prefill": _fields("request tokens", "blocks"),
    "decode": _fields("request token", "blocks"),
    "insert": _fields("request blocks"),
    "exit": _fields("request to", "writes"),
    "tick": _fields("", "ticks"),
    **SHARED_FIELDS,
}
OBSERVED = frozenset("gpu_free cpu_free refcounts gpu_findable cpu_findable gpu_flagged cpu_flagged counters".split())
CACHE_HEADER = _fields("format version gpu_blocks cpu_blocks", "level")
SCHEDULER_HEADER = _fields("format version level gpu_blocks cpu_blocks block_size timeout", "reserve")
MOST_BLOCKS = 1 << 22  # per tier: the replay holds every block, and each event's check walks them


def _checked(obj: Mapping[str, object], fields: Fields, line: int, what: str, also: frozenset[str] = frozenset()) -> None:
    """A format error naming the missing fields of `obj` and those it should not have."""
    required, optional = fields
    missing = sorted(required - obj.keys())
    unknown = sorted(k for k in obj.keys() - required - optional - also if not k.startswith("_"))
    known = ", ".join(sorted(required | optional | also))
    if missing:  # a field misspelt is both: say both
        beside = f", and has no field {', '.join(map(repr, unknown))} (its fields: {known})" if unknown else ""
        raise TraceFormatError(line, f"{what} lacks {', '.join(missing)}{beside}")
    if unknown:
        raise TraceFormatError(line, f"{what} has no field {', '.join(map(repr, unknown))} (its fields: {known}; "
                                     "an engine's own notes go in fields whose names start with _)")


def _no_op(op: object, level: str, table: Mapping[str, Fields] | None = None) -> str:
    """What is wrong with an event's op (none, not a string, or another level's)."""
    known = ", ".join(sorted(table or SCHEDULER_FIELDS) + (sorted(SCHEDULING) if level == "scheduler" else []))
    said = "the event has no op" if op is None else f"unknown op {json.dumps(op)}"
    return f"{said} for a {level}-level trace (one of: {known})"


def _event_fields(ev: Json, line: int, table: Mapping[str, Fields], level: str) -> str:
    """The event's op, once its fields are those the op takes."""
    op = ev.get("op")
    if not isinstance(op, str) or op not in table:
        raise TraceFormatError(line, _no_op(op, level, table))
    _checked(ev, table[op], line, f"this {op} event", also=frozenset({"op", "observe"}))
    return op


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON's true is no count


def _ints(x: object, line: int, what: str) -> list[int]:
    if not isinstance(x, list) or not all(map(_is_int, x)):
        raise TraceFormatError(line, f"{what} must be a list of integers")
    return cast(list[int], x)


def _int(x: object, line: int, what: str, least: int | None = None) -> int:
    if not _is_int(x):
        raise TraceFormatError(line, f"{what} must be an integer")
    if least is not None and x < least:
        raise TraceFormatError(line, f"{what} must be at least {least}, not {x}")
    return x


def _hash(x: object, line: int, what: str) -> BlockHash:
    """A block hash: an unsigned 64-bit integer (spec's hashes are; an engine's must fit too)."""
    h = _int(x, line, what, least=0)
    if h >= 1 << 64:
        raise TraceFormatError(line, f"{what} must be below 2**64 (an unsigned 64-bit hash), not {h}")
    return BlockHash(h)


def _hashes(x: object, line: int, what: str) -> tuple[BlockHash, ...]:
    return tuple(_hash(h, line, f"a hash of {what}") for h in _ints(x, line, what))


def outcome_of(x: object, line: int) -> Outcome:
    simple: dict[object, Outcome] = {"ok": Ok(), "error": Error(), "timeout": Timeout()}
    if isinstance(x, str) and x in simple:
        return simple[x]
    if isinstance(x, list) and len(x) == 2 and x[0] == "partial" and _is_int(x[1]) and x[1] >= 0:
        return Partial(x[1])
    raise TraceFormatError(line, f"unknown outcome {x!r} (ok, error, timeout or [\"partial\", k])")


def outcome_json(o: Outcome) -> object:
    return ["partial", o.done] if isinstance(o, Partial) else type(o).__name__.lower()


def step_of(x: object, line: int) -> EvictStep:
    if isinstance(x, list) and len(x) == 3 and x[0] == "swap_out":
        return SwapOutTo(_hash(x[1], line, "node"), CpuBlock(_int(x[2], line, "cpu block", least=0)))
    if isinstance(x, list) and len(x) == 3 and x[0] == "stale" and x[2] in ("gpu", "cpu"):
        return SkipStale(_hash(x[1], line, "node"), Tier(x[2]))
    if isinstance(x, list) and len(x) == 2 and x[0] in ("drop", "evict_cpu"):
        h = _hash(x[1], line, "node")
        return Drop(h) if x[0] == "drop" else EvictCpu(h)
    raise TraceFormatError(line, f"unknown eviction step {x!r}")


def step_json(s: EvictStep) -> list[object]:
    if isinstance(s, SwapOutTo):
        return ["swap_out", s.node, s.cpu]
    if isinstance(s, SkipStale):
        return ["stale", s.node, s.tier.value]
    return ["drop" if isinstance(s, Drop) else "evict_cpu", s.node]


def _writes(ev: Json, line: int) -> tuple[tuple[BlockHash, GpuBlock], ...]:
    pairs = ev.get("writes", [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise TraceFormatError(line, "writes must be a list of [hash, block] pairs")
    return tuple((_hash(p[0], line, "hash"), GpuBlock(_int(p[1], line, "block", least=0))) for p in pairs)


def _blocks(ev: Json, key: str, line: int) -> tuple[GpuBlock, ...]:
    return tuple(GpuBlock(_int(g, line, f"a block of {key}", least=0)) for g in _ints(ev.get(key, []), line, key))


def _shared_event(op: str, ev: Json, line: int) -> Evict | Complete | Reset | None:
    """An event both levels have."""
    if op == "evict":
        steps = ev.get("steps")
        if not isinstance(steps, list):
            raise TraceFormatError(line, "steps must be a list")
        return Evict(tuple(step_of(x, line) for x in steps))
    if op == "complete":
        return Complete(TransferId(_int(ev.get("transfer"), line, "transfer")), outcome_of(ev.get("outcome"), line))
    if op == "reset":
        return Reset()
    return None


def cache_event(ev: Json, line: int) -> CacheEvent:
    """The cache action a cache-level event names, with the engine's choices."""
    op = _event_fields(ev, line, CACHE_FIELDS, "cache")
    shared = _shared_event(op, ev, line)
    if shared is not None:
        return shared
    r = RequestId(_int(ev["request"], line, "request"))
    hashes = _hashes(ev.get("hashes", []), line, "hashes")
    if op == "match":
        limit = ev.get("limit")
        return Match(r, hashes, _blocks(ev, "swap_dests", line), _blocks(ev, "prefetch_dests", line),
                     None if limit is None else _int(limit, line, "limit", least=0))
    if op == "allocate":
        return Allocate(r, _blocks(ev, "blocks", line))
    if op == "commit":
        return Commit(r, hashes)
    return Release(r, _writes(ev, line))


EXIT_STATUS = {"finished": Status.FINISHED, "aborted": Status.ABORTED, "preempted": Status.PREEMPTED}


def system_event(ev: Json, line: int) -> Event:
    """The system action a scheduler-level event names, with the engine's choices."""
    op = _event_fields(ev, line, SCHEDULER_FIELDS, "scheduler")
    shared = _shared_event(op, ev, line)
    if shared is not None:
        return shared
    if op == "tick":
        return Tick(_int(ev.get("ticks", 1), line, "ticks", least=0))
    r = RequestId(_int(ev["request"], line, "request"))
    if op == "submit":
        return Submit(r, tuple(_ints(ev.get("tokens"), line, "tokens")))
    if op == "admit":
        return Admit(r, _blocks(ev, "swap_dests", line), _blocks(ev, "prefetch_dests", line))
    if op == "prefill":
        return Prefill(r, _int(ev.get("tokens"), line, "tokens"), _blocks(ev, "blocks", line))
    if op == "decode":
        return Decode(r, _int(ev.get("token"), line, "token"), _blocks(ev, "blocks", line))
    if op == "insert":
        return Insert(r, _int(ev.get("blocks"), line, "blocks"))
    if op == "exit":
        to = ev.get("to")
        if not isinstance(to, str) or to not in EXIT_STATUS:
            raise TraceFormatError(line, f"exit to {to!r}: one of {', '.join(EXIT_STATUS)}")
        return Exit(r, EXIT_STATUS[to], _writes(ev, line))
    raise AssertionError(f"SCHEDULER_FIELDS names {op!r}, which system_event does not decode")


# --- what the engine reports ---------------------------------------------------------------


def observed(s: CacheState, obs: object, line: int) -> View:
    """The view of the state as the engine reports it: each reported field replaces the
    specification's own; reported counters are judged against the recount."""
    if not isinstance(obs, dict):
        raise TraceFormatError(line, "observe must be an object")
    _checked(obs, (frozenset(), OBSERVED), line, "observe")
    if "gpu_free" in obs:
        s = replace(s, gpu_free=tuple(sorted(GpuBlock(g) for g in _ints(obs["gpu_free"], line, "gpu_free"))))
    if "cpu_free" in obs:
        s = replace(s, cpu_free=tuple(sorted(CpuBlock(c) for c in _ints(obs["cpu_free"], line, "cpu_free"))))
    if "refcounts" in obs:
        refs = obs["refcounts"]
        if not isinstance(refs, dict):
            raise TraceFormatError(line, "refcounts must map node hashes (as strings) to counts")
        nodes = dict(s.nodes)
        for k, v in refs.items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit()):
                raise TraceFormatError(line, f"refcounts are keyed by node hashes in decimal, not {k!r}")
            h = _hash(int(k), line, f"the refcounts' key {k}")
            if h in nodes:
                nodes[h] = replace(nodes[h], refcount=_int(v, line, "refcount"))
        s = replace(s, nodes=nodes)
    s = replace(s, gpu_heap=_heap(obs, "gpu", s.gpu_heap, line), cpu_heap=_heap(obs, "cpu", s.cpu_heap, line))
    reported = obs.get("counters", {})
    if not isinstance(reported, dict):
        raise TraceFormatError(line, "counters must map counter names to counts")
    true = true_counters(s)
    unknown = sorted(set(reported) - set(true))
    if unknown:
        raise TraceFormatError(line, f"unknown counters {unknown} (known: {', '.join(true)})")
    return with_kept_counters(s, {k: _int(v, line, k) for k, v in reported.items()})


def _heap(obs: Mapping[str, object], tier: str, heap: Heap, line: int) -> Heap:
    """The heap as reported: `<tier>_findable` its entries, `<tier>_flagged` its in_heap
    flags (taken to agree with the entries when only those are reported)."""
    if f"{tier}_findable" not in obs:
        return heap
    entries = frozenset(_hashes(obs[f"{tier}_findable"], line, f"{tier}_findable"))
    flagged = obs.get(f"{tier}_flagged")
    return Heap(entries, entries if flagged is None else frozenset(_hashes(flagged, line, f"{tier}_flagged")))


# --- checking ----------------------------------------------------------------------------------------


def _header_version(head: Json, line: int) -> int:
    """The header's version, or the format error that says what is wrong with the header."""
    if "op" in head and "format" not in head:
        raise TraceFormatError(line, "this is an event: a trace starts with a header, "
                                     f'{{"format": "{FORMAT}", "version": {VERSION}, "level": ..., ...}}')
    if head.get("format") != FORMAT:
        raise TraceFormatError(line, f'the header\'s format must be "{FORMAT}", not {json.dumps(head.get("format"))}')
    version = head.get("version")
    if not _is_int(version) or version not in (1, 2, VERSION):
        raise TraceFormatError(line, f"the header's version is {json.dumps(version)}: this kvoracle reads versions "
                                     f"1, 2 and {VERSION} (integers)")
    return version


def check_trace(lines: Sequence[str]) -> TraceReport:
    """Replay a trace through spec/; stop at the first violation. `lines` are the file's,
    blank ones included (skipped, so that each line keeps its number)."""
    rows = [(n, text) for n, text in enumerate(lines, 1) if text.strip()]
    if not rows:
        raise TraceFormatError(1, "empty trace")
    top, header = rows[0]
    head = _parse(header, top)
    version = _header_version(head, top)
    level = head.get("level", "cache")
    if level not in ("cache", "scheduler"):
        raise TraceFormatError(top, f"level must be \"cache\" or \"scheduler\", not {level!r}")
    _checked(head, SCHEDULER_HEADER if level == "scheduler" else CACHE_HEADER, top, f"a {level}-level header")
    gpu, cpu = (_int(head.get(tier), top, tier, least=0) for tier in ("gpu_blocks", "cpu_blocks"))
    for tier, blocks in (("gpu_blocks", gpu), ("cpu_blocks", cpu)):
        if blocks > MOST_BLOCKS:
            raise TraceFormatError(top, f"{tier} is {blocks:,}: kvoracle replays every block, and checks at most "
                                      f"{MOST_BLOCKS:,} per tier")
    if level == "scheduler":
        if version == 1:
            raise TraceFormatError(top, "version 1 had no scheduler level: a scheduler-level trace is version 3")
        if version != VERSION:  # its hashes were spec's, and spec's block hashes changed in version 3
            raise TraceFormatError(top, f"a scheduler-level trace of version {version} names blocks by the "
                                      f"earlier block hash; record it again with this kvoracle (version {VERSION})")
        reserve = _int(head.get("reserve", 0), top, "reserve", least=0)
        if reserve and reserve >= gpu:
            raise TraceFormatError(top, f"reserve must be below gpu_blocks ({gpu}), not {reserve}")
        size = _int(head.get("block_size"), top, "block_size", least=1)
        timeout = _int(head.get("timeout"), top, "timeout", least=1)
        return _replay_system(lines, rows[1:], initial_system(gpu, cpu, size, timeout), reserve)
    return _replay_cache(lines, rows[1:], initial(gpu, cpu))


# What a trace must carry for each property that reads the engine's own state (docs/trace.md,
# "What is checked"): the observed fields, any one of which feeds it
NEEDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gpu_free", "cpu_free"), "INV-CONSERVE, INV-NO-UAF, INV-TIER, INV-PIN and LIVE-EXIT"),
    (("refcounts",), "INV-REFCOUNT"),
    (("gpu_findable", "cpu_findable"), "INV-HEAP-SOUND and INV-HEAP-COMPLETE"),
    (("counters",), "INV-COUNTERS"),
)


def unreported(reported: Collection[str], ops: Collection[object], level: str) -> tuple[str, ...]:
    """The properties a passing trace could not judge, for want of an observed field no
    event `reported`, or (scheduler level) of `ops` it never has: the replayed state
    satisfies every property by construction, so without them the engine's own state
    is never seen and its leaks and double frees pass."""
    gaps = [f"{ids}: no event reports {' or '.join(fields)}" for fields, ids in NEEDS
            if not any(f in reported for f in fields)]
    if level == "scheduler" and "tick" not in ops:
        gaps.append("LIVE-TRANSFER: no tick event (the trace's clock never moves)")
    if level == "scheduler" and "scheduled" not in ops:
        gaps.append("LIVE-ADMIT and LIVE-PROGRESS: no schedule and scheduled lines")
    return tuple(gaps)


def _reported(ev: Json) -> Iterable[str]:
    obs = ev.get("observe")
    return obs.keys() if isinstance(obs, dict) else ()


def _replay_cache(lines: Sequence[str], events: Sequence[tuple[int, str]], s: CacheState) -> TraceReport:
    before = of_cache(s)
    reported: set[str] = set()
    for count, (n, text) in enumerate(events, 1):
        ev = _parse(text, n)
        reported.update(_reported(ev))
        event = cache_event(ev, n)
        try:
            s = actions.apply_cache(s, event)
        except PreconditionError as e:
            return TraceReport(count, [Violation("PRECONDITION", str(e))], n, list(lines[:n]))
        after = observed(s, ev["observe"], n) if "observe" in ev else of_cache(s)
        found = liveness.live_exit(before, after, request_name(event.request)) if isinstance(event, Release) else []
        found += by_severity(check(after))
        if found:
            return TraceReport(count, found, n, list(lines[:n]))
        before = after
    return TraceReport(len(events), [], 0, [], unfinished(s, sorted(s.requests)), unreported(reported, (), "cache"))


@dataclass
class _Steps:
    """What LIVE-ADMIT and LIVE-PROGRESS need of a scheduler trace's scheduling steps: the
    open step's start (its state and view), the streak so far, the most tokens each
    request was seen computed (outside a step, as a machine sees an engine between calls)."""

    room: int
    start: tuple[System, View] | None = None
    streak: liveness.Streak = liveness.Streak()
    furthest: dict[str, int] = field(default_factory=dict)

    def mark(self, op: object, s: System, view: View, line: int) -> list[Violation]:
        """A `schedule` line opens a step, a `scheduled` line closes it and judges it."""
        if (op == "schedule") == (self.start is not None):
            raise TraceFormatError(line, "schedule opens a scheduling step and scheduled closes it: they alternate")
        if op == "schedule":
            self.furthest = liveness.most_computed(self.furthest, view)
            self.start = (s, view)
            return []
        assert self.start is not None
        (begun, before), self.start = self.start, None
        in_flight = (len(begun.cache.transfers), len(s.cache.transfers))
        self.streak = liveness.scheduled(self.streak, before, view, liveness.needs(begun),
                                         liveness.needs(begun, among=(Status.RUNNING,)), self.room, in_flight,
                                         self.furthest)
        return liveness.streak_violations(self.streak)

    def between(self, event: Event, s: System, before: View) -> None:
        """An event outside any scheduling step."""
        if self.start is None:
            self.furthest = liveness.most_computed(self.furthest, before)
            running = any(q.status is Status.RUNNING for q in s.requests.values())
            self.streak = liveness.between(self.streak, isinstance(event, Tick | Submit), running)


SCHEDULING = ("schedule", "scheduled")  # the lines that delimit a scheduling step (no spec action)


def _replay_system(lines: Sequence[str], events: Sequence[tuple[int, str]], s: System, reserve: int) -> TraceReport:
    before = _system_view(s, of_cache(s.cache))
    steps = _Steps(s.cache.gpu_size - reserve)
    reported: set[str] = set()
    ops: set[str] = set()
    last = 0  # the line of the event before this one (0 before the first, when nothing is in flight)
    for count, (n, text) in enumerate(events, 1):
        ev = _parse(text, n)
        reported.update(_reported(ev))
        op = ev.get("op")
        if not isinstance(op, str):  # (a list as op cannot even be looked up)
            raise TraceFormatError(n, _no_op(op, "scheduler"))
        ops.add(op)
        if op in SCHEDULING:
            _checked(ev, (frozenset({"op"}), frozenset()), n, f"a {op} line (it carries nothing but its op)")
            found = steps.mark(op, s, before, n)
            if found:
                return TraceReport(count, found, n, list(lines[:n]))
            last = n
            continue
        event = system_event(ev, n)
        # time moves on: whatever the last tick timed out has been answered in the lines since
        late = _late(s, count - 1, lines[:n]) if isinstance(event, Tick) else None  # at the tick that went past
        if late is not None:
            return late
        try:
            s = scheduler.apply(s, event)
        except PreconditionError as e:
            return TraceReport(count, [Violation("PRECONDITION", str(e))], n, list(lines[:n]))
        after = _system_view(s, observed(s.cache, ev["observe"], n) if "observe" in ev else of_cache(s.cache))
        found = liveness.live_exit(before, after, request_name(event.request)) if isinstance(event, Exit) else []
        found += by_severity(check(after))
        if found:
            return TraceReport(count, found, n, list(lines[:n]))
        steps.between(event, s, before)
        before = after
        last = n
    return _late(s, len(events), lines[:last]) or TraceReport(
        len(events), [], 0, [], unfinished(s.cache, scheduler.live(s)), unreported(reported, ops, "scheduler"))


def unfinished(s: CacheState, live: Sequence[RequestId]) -> str:
    """What a trace ending in state s, with these requests live, leaves unjudged: their
    exits (LIVE-EXIT: do their blocks come back?) and the transfers still in flight."""
    if not live and not s.transfers:
        return ""
    held = sum(len(actions.table(s, r)) for r in live if r in s.requests)
    parts = [f"{len(live)} request{'s' if len(live) != 1 else ''} live ({', '.join(request_name(r) for r in live[:8])}"
             f"{', ...' if len(live) > 8 else ''}; {held} GPU block{'s' if held != 1 else ''} held)"] if live else []
    if s.transfers:
        parts.append(f"{len(s.transfers)} transfer{'s' if len(s.transfers) != 1 else ''} in flight")
    one = len(live) + len(s.transfers) == 1
    return (f"the trace ends with {' and '.join(parts)}: whether {'its' if one else 'their'} blocks come back is not "
            "judged (LIVE-EXIT judges each exit the trace has, LIVE-TRANSFER each transfer on a scheduler-level "
            "trace's clock); a trace that goes on until the engine is idle judges it")


def _late(s: System, events: int, prefix: Sequence[str]) -> TraceReport | None:
    """LIVE-TRANSFER on state s, the one the trace's lines `prefix` (its first `events`
    events) reach."""
    found = liveness.live_transfer(s.started, s.now, s.timeout)
    return TraceReport(events, found, len(prefix), list(prefix)) if found else None


def decimal_hashes(violations: Sequence[Violation]) -> str:
    """The hexadecimal node hashes spec's messages name, each with its decimal form, as a
    trace writes it (so that the trace can be searched for it)."""
    found = dict.fromkeys(h for v in violations for h in re.findall(r"\b0x[0-9a-f]+\b", v.message))
    return ", ".join(f"{h} = {int(h, 16)}" for h in found)


def _system_view(s: System, cache: View) -> View:
    """The cache as observed, and the request lifecycle as the trace has it."""
    live = frozenset(request_name(r) for r in scheduler.live(s))
    queued = frozenset(request_name(r) for r, q in s.requests.items() if q.status in (Status.WAITING,
                                                                                        Status.PREEMPTED))
    computed = {request_name(r): q.computed for r, q in s.requests.items() if q.status is Status.RUNNING}
    return replace(cache, live=live, queued=queued, computed=computed, block_size=s.block_size)


def _parse(text: str, line: int) -> Json:
    try:
        ev = json.loads(text, object_pairs_hook=partial(_unique, line))
    except json.JSONDecodeError as e:
        raise TraceFormatError(line, f"not JSON ({e.msg})") from e
    if not isinstance(ev, dict):
        raise TraceFormatError(line, "an event must be a JSON object")
    return cast(Json, ev)


def _unique(line: int, pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose every field is named once (JSON leaves a repeated name's meaning open)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        repeated = sorted({k for k, _ in pairs if [name for name, _ in pairs].count(k) > 1})
        raise TraceFormatError(line, f"field {', '.join(map(repr, repeated))} given twice")
    return obj


# --- recording the reference ---------------------------------------------------------------------


def snapshot(cache: CacheManager) -> Json:
    """What the reference reports of its state, in the trace's `observe` form."""
    s = abstract(cache)
    return {
        "gpu_free": list(s.gpu_free), "cpu_free": list(s.cpu_free),
        "refcounts": {str(h): n.refcount for h, n in s.nodes.items()},
        "gpu_findable": sorted(s.gpu_heap.entries), "cpu_findable": sorted(s.cpu_heap.entries),
        "gpu_flagged": sorted(s.gpu_heap.flagged), "cpu_flagged": sorted(s.cpu_heap.flagged),
        "counters": kept_counters(cache),
    }


def header(gpu_blocks: int, cpu_blocks: int) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "level": "cache",
                       "gpu_blocks": gpu_blocks, "cpu_blocks": cpu_blocks})


def record(out: TextIO, *, steps: int, seed: int, gpu_blocks: int = 8, cpu_blocks: int = 3,
           cache_class: type[CacheManager] = CacheManager) -> int:
    """Drive the reference cache (or a subclass: a mutant) with a seeded random workload
    and write its trace, until at least `steps` events are written, then release every
    request and answer every transfer, so that the trace ends idle (the events written
    are returned)."""
    rnd = random.Random(seed)
    cache = cache_class(gpu_blocks, cpu_blocks)
    prompts = [block_hashes(p, 2) for p in ((1, 1, 2, 2), (1, 1, 2, 1), (2, 2, 1, 1), (1, 1))]
    live: dict[RequestId, tuple[BlockHash, ...]] = {}
    out.write(header(gpu_blocks, cpu_blocks) + "\n")
    written, next_r = 0, 0

    def emit(ev: Json) -> None:
        nonlocal written
        ev["observe"] = snapshot(cache)
        out.write(json.dumps(ev) + "\n")
        written += 1

    while written < steps:
        k = rnd.randrange(6)
        if k == 0 and len(live) < 3:
            r, hashes = RequestId(next_r), prompts[rnd.randrange(len(prompts))]
            next_r += 1
            need = len(hashes) - cache.gpu_hits(hashes)
            if need <= cache.gpu.num_free:
                rep = cache.match(r, hashes, limit=need)
                emit({"op": "match", "request": r, "hashes": list(hashes), "swap_dests": list(rep.swap_dests),
                      "prefetch_dests": list(rep.prefetch_dests), "limit": need})
                blocks = cache.allocate(r, len(hashes) - len(cache.table(r)))
                emit({"op": "allocate", "request": r, "blocks": list(blocks)})
                live[r] = hashes
        elif k == 1 and live:
            r = rnd.choice(sorted(live))
            if cache.ready(r):
                cache.commit(r, live[r])
                emit({"op": "commit", "request": r, "hashes": list(live[r])})
        elif k == 2 and live:
            r = rnd.choice(sorted(live))
            hashes = live.pop(r)
            rel = cache.release(r, hashes if rnd.random() < 0.5 else ())
            emit({"op": "release", "request": r, "writes": [list(w) for w in rel.writes]})
        elif k == 3:
            ev = cache.evict_gpu(rnd.randint(1, 3))
            if ev.steps:
                emit({"op": "evict", "steps": [step_json(st) for st in ev.steps]})
        elif k == 4 and cache.jobs:
            t = rnd.choice(cache.in_flight())
            choices: list[Outcome] = [Ok(), Ok(), Error(), Timeout(), Partial(0)]
            o = rnd.choice(choices)
            cache.complete(t, o)
            emit({"op": "complete", "transfer": t, "outcome": outcome_json(o)})
        elif k == 5 and not live and cache.tree.size and rnd.random() < 0.2:
            cache.reset()
            emit({"op": "reset"})
    for r in sorted(live):  # the trace ends idle: every exit and every transfer is judged
        cache.release(r, ())
        emit({"op": "release", "request": r, "writes": []})
    for t in sorted(cache.in_flight()):
        cache.complete(t, Ok())
        emit({"op": "complete", "transfer": t, "outcome": "ok"})
    return written


def event_json(e: Event) -> Json:
    """A scheduler-level event as its trace line (system_event reads it back)."""
    if isinstance(e, Evict):
        return {"op": "evict", "steps": [step_json(x) for x in e.steps]}
    if isinstance(e, Complete):
        return {"op": "complete", "transfer": e.transfer, "outcome": outcome_json(e.outcome)}
    if isinstance(e, Reset):
        return {"op": "reset"}
    if isinstance(e, Tick):
        return {"op": "tick", "ticks": e.ticks}
    line: Json = {"op": type(e).__name__.lower(), "request": e.request}
    if isinstance(e, Submit):
        line["tokens"] = list(e.tokens)
    elif isinstance(e, Admit):
        line.update(swap_dests=list(e.swap_dests), prefetch_dests=list(e.prefetch_dests))
    elif isinstance(e, Prefill):
        line.update(tokens=e.tokens, blocks=list(e.blocks))
    elif isinstance(e, Decode):
        line.update(token=e.token, blocks=list(e.blocks))
    elif isinstance(e, Insert):
        line["blocks"] = e.blocks
    else:
        line.update(to=e.to.value, writes=[list(w) for w in e.writes])
    return line


def record_scheduler(out: TextIO, *, steps: int, seed: int, scheduler_class: type[ResourceManager] = ResourceManager,
                     cache_class: type[CacheManager] = CacheManager, gpu_blocks: int = 8, cpu_blocks: int = 3) -> int:
    """Drive the reference scheduler (or a subclass: a mutant) with a seeded random
    workload and write its scheduler-level trace, each `schedule()` between a `schedule`
    and a `scheduled` line, until at least `steps` lines follow the header (returned)."""
    rnd, plan, block_size, timeout = random.Random(seed), ScriptedFaults(), 2, 4
    rm = scheduler_class(cache_class(gpu_blocks, cpu_blocks), FaultyStorage(MemoryStorage(), plan),
                         FaultyCopier(plan), block_size=block_size, write_policy=WritePolicy.ON_FINISH_AND_PREEMPT,
                         timeout=timeout)
    out.write(json.dumps({"format": FORMAT, "version": VERSION, "level": "scheduler", "gpu_blocks": gpu_blocks,
                          "cpu_blocks": cpu_blocks, "block_size": block_size, "timeout": timeout}) + "\n")
    prompts = [(1, 1, 2, 2), (1, 1, 2, 2, 3, 3), (2, 2, 1, 1), (1, 1, 3)]
    written, next_r = 0, 0

    def emit(*lines: Json) -> None:
        nonlocal written
        for line in [*lines[:1], *map(event_json, rm.events), *lines[1:]]:
            out.write(json.dumps(line) + "\n")
            written += 1
        rm.events.clear()

    while written < steps:
        k, live = rnd.randrange(8), [*rm.running, *rm.waiting]
        if k == 0 and len(live) < 4:
            rm.submit(RequestId(next_r), prompts[rnd.randrange(len(prompts))])
            next_r += 1
            emit()
        elif k in (1, 2, 3):
            rm.schedule()
            emit({"op": "schedule"}, {"op": "scheduled"})
        elif k == 4 and rm.running:
            rm.finish([rnd.choice(rm.running)])
            emit()
        elif k == 5 and live:
            rm.abort(rnd.choice(live))
            emit()
        elif k == 6 and rm.running:
            rm.preempt(rnd.choice(rm.running))
            emit()
        elif k == 7:
            ticks = rnd.randint(1, 2)
            rm.tick(ticks)
            emit({"op": "tick", "ticks": ticks})
    return written


def read_lines(source: Iterable[str | bytes]) -> list[str]:
    """The trace's lines, blank ones as "" (from a file opened as text or, so that a line
    that is not UTF-8 is named, as bytes: a binary or compressed file is a format error)."""
    lines = []
    for n, raw in enumerate(source, 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as e:
            raise TraceFormatError(n, f"not UTF-8 text (byte {e.object[e.start]:#04x}): a trace is JSON Lines, "
                                      "not a binary or compressed file") from e
        if n == 1:
            line = line.removeprefix("\ufeff")  # a byte-order mark some writers put first is no part of the JSON
        lines.append(line.rstrip("\r\n") if line.strip() else "")
    return lines
