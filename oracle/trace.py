"""Traces: a versioned JSON Lines record of cache-level events and observed states.

An engine that cannot be driven from Python writes one; `kvoracle check-trace FILE`
replays it against spec/ and reports the first violation with the shortest prefix
of the trace that shows it. The format is documented in docs/trace.md.

    line 1   {"format": "kvoracle-trace", "version": 1, "gpu_blocks": G, "cpu_blocks": C}
    then     one event per line: {"op": ..., <arguments>, "observe": {...}?}

Every event is a spec action with the choices the engine made; `observe` (optional,
on any event) is what the engine reports of its state after the event, and is
checked against what the specification says that state is.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Mapping, TextIO, cast

from kvoracle.kvcache.abstraction import abstract, observe
from kvoracle.kvcache.manager import CacheManager
from kvoracle.spec import actions
from kvoracle.spec.actions import Drop, EvictCpu, EvictStep, PreconditionError, SwapOutTo
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation, by_severity, check
from kvoracle.spec.state import CacheState, Counters, Observed, initial
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    Error,
    GpuBlock,
    Ok,
    Outcome,
    Partial,
    RequestId,
    Timeout,
    TransferId,
)

FORMAT, VERSION = "kvoracle-trace", 1
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
    line: int  # the line of the first violating event (0: none)
    prefix: list[str]  # the trace up to and including that line

    @property
    def passed(self) -> bool:
        return not self.violations


# --- decoding -----------------------------------------------------------------------------------


def _ints(x: object, line: int, what: str) -> list[int]:
    if not isinstance(x, list) or not all(isinstance(v, int) for v in x):
        raise TraceFormatError(line, f"{what} must be a list of integers")
    return cast(list[int], x)


def _int(x: object, line: int, what: str) -> int:
    if not isinstance(x, int):
        raise TraceFormatError(line, f"{what} must be an integer")
    return x


def outcome_of(x: object, line: int) -> Outcome:
    simple: dict[object, Outcome] = {"ok": Ok(), "error": Error(), "timeout": Timeout()}
    if isinstance(x, str) and x in simple:
        return simple[x]
    if isinstance(x, list) and len(x) == 2 and x[0] == "partial" and isinstance(x[1], int):
        return Partial(x[1])
    raise TraceFormatError(line, f"unknown outcome {x!r} (ok, error, timeout or [\"partial\", k])")


def outcome_json(o: Outcome) -> object:
    return ["partial", o.done] if isinstance(o, Partial) else type(o).__name__.lower()


def step_of(x: object, line: int) -> EvictStep:
    if isinstance(x, list) and len(x) == 3 and x[0] == "swap_out":
        return SwapOutTo(BlockHash(_int(x[1], line, "node")), CpuBlock(_int(x[2], line, "cpu block")))
    if isinstance(x, list) and len(x) == 2 and x[0] in ("drop", "evict_cpu"):
        h = BlockHash(_int(x[1], line, "node"))
        return Drop(h) if x[0] == "drop" else EvictCpu(h)
    raise TraceFormatError(line, f"unknown eviction step {x!r}")


def step_json(s: EvictStep) -> list[object]:
    if isinstance(s, SwapOutTo):
        return ["swap_out", s.node, s.cpu]
    return ["drop" if isinstance(s, Drop) else "evict_cpu", s.node]


def apply(s: CacheState, ev: Json, line: int) -> CacheState:
    """The spec action an event names, with the engine's choices."""
    op = ev.get("op")
    r = RequestId(_int(ev.get("request", -1), line, "request"))
    if op == "match":
        return actions.match(s, r, [BlockHash(h) for h in _ints(ev.get("hashes"), line, "hashes")],
                             [GpuBlock(g) for g in _ints(ev.get("swap_dests", []), line, "swap_dests")],
                             [GpuBlock(g) for g in _ints(ev.get("prefetch_dests", []), line, "prefetch_dests")])
    if op == "allocate":
        return actions.allocate(s, r, [GpuBlock(g) for g in _ints(ev.get("blocks"), line, "blocks")])
    if op == "commit":
        return actions.commit(s, r, [BlockHash(h) for h in _ints(ev.get("hashes"), line, "hashes")])
    if op == "release":
        pairs = ev.get("writes", [])
        if not isinstance(pairs, list):
            raise TraceFormatError(line, "writes must be a list of [hash, block] pairs")
        writes = [(BlockHash(_int(p[0], line, "hash")), GpuBlock(_int(p[1], line, "block"))) for p in pairs]
        return actions.release(s, r, writes)
    if op == "evict":
        steps = ev.get("steps")
        if not isinstance(steps, list):
            raise TraceFormatError(line, "steps must be a list")
        return actions.evict(s, [step_of(x, line) for x in steps])
    if op == "complete":
        return actions.complete(s, TransferId(_int(ev.get("transfer"), line, "transfer")),
                                outcome_of(ev.get("outcome"), line))
    if op == "reset":
        return actions.reset(s)
    raise TraceFormatError(line, f"unknown op {op!r}")


def observed(s: CacheState, obs: object, line: int) -> tuple[CacheState, Observed | None]:
    """The state as the engine reports it: reported fields replace the spec's own."""
    if not isinstance(obs, dict):
        raise TraceFormatError(line, "observe must be an object")
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
            h = BlockHash(int(k))
            if h in nodes:
                nodes[h] = replace(nodes[h], refcount=_int(v, line, "refcount"))
        s = replace(s, nodes=nodes)
    if "gpu_findable" not in obs:
        return s, None
    c = obs.get("counters", {})
    counters = Counters(**{k: _int(v, line, k) for k, v in cast(Mapping[str, object], c).items()})
    return s, Observed(frozenset(BlockHash(h) for h in _ints(obs["gpu_findable"], line, "gpu_findable")),
                       frozenset(BlockHash(h) for h in _ints(obs.get("cpu_findable", []), line, "cpu_findable")),
                       counters)


def check_trace(lines: Sequence[str]) -> TraceReport:
    """Replay a trace against spec/; stop at the first violation."""
    if not lines:
        raise TraceFormatError(1, "empty trace")
    head = _parse(lines[0], 1)
    if head.get("format") != FORMAT or head.get("version") != VERSION:
        raise TraceFormatError(1, f"not a {FORMAT} version {VERSION} header")
    s = initial(_int(head.get("gpu_blocks"), 1, "gpu_blocks"), _int(head.get("cpu_blocks"), 1, "cpu_blocks"))
    for n, text in enumerate(lines[1:], 2):
        ev = _parse(text, n)
        try:
            s = apply(s, ev, n)
        except PreconditionError as e:
            return TraceReport(n - 1, [Violation("PRECONDITION", str(e))], n, list(lines[:n]))
        seen, obs = observed(s, ev["observe"], n) if "observe" in ev else (s, None)
        found = by_severity(check(seen, obs))
        if found:
            return TraceReport(n - 1, found, n, list(lines[:n]))
    return TraceReport(len(lines) - 1, [], 0, [])


def _parse(text: str, line: int) -> Json:
    try:
        ev = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(line, f"not JSON ({e.msg})") from e
    if not isinstance(ev, dict):
        raise TraceFormatError(line, "an event must be a JSON object")
    return cast(Json, ev)


# --- recording the reference ---------------------------------------------------------------------


def snapshot(cache: CacheManager) -> Json:
    """What the reference reports of its state, in the trace's `observe` form."""
    s, o = abstract(cache), observe(cache)
    return {
        "gpu_free": list(s.gpu_free), "cpu_free": list(s.cpu_free),
        "refcounts": {str(h): n.refcount for h, n in s.nodes.items()},
        "gpu_findable": sorted(o.gpu_findable), "cpu_findable": sorted(o.cpu_findable),
        "counters": {k: getattr(o.counters, k) for k in Counters.__dataclass_fields__},
    }


def record(out: TextIO, *, steps: int, seed: int, gpu_blocks: int = 8, cpu_blocks: int = 3) -> int:
    """Drive the reference cache with a seeded random workload and write its trace."""
    rnd = random.Random(seed)
    cache = CacheManager(gpu_blocks, cpu_blocks)
    prompts = [block_hashes(p, 2) for p in ((1, 1, 2, 2), (1, 1, 2, 1), (2, 2, 1, 1), (1, 1))]
    live: dict[RequestId, tuple[BlockHash, ...]] = {}
    out.write(json.dumps({"format": FORMAT, "version": VERSION, "gpu_blocks": gpu_blocks, "cpu_blocks": cpu_blocks}) + "\n")
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
                      "prefetch_dests": list(rep.prefetch_dests)})
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
    return written


def read_lines(source: Iterable[str]) -> list[str]:
    return [line.rstrip("\n") for line in source if line.strip()]
