"""Turning a machine's counterexample into a standalone reproduction, at every level
(request, cache, scheduler): the engine calls the shrunk program made (a Scripted
adapter records them as source text), then the check that fired, generated: kvoracle's
own predicate for that property ID, evaluated on the state the calls left through the
adapter's observation code, with what the checker itself kept (the view before the
last call, its record of spec's state and of when transfers started). So a
reproduction fails with the campaign's ID for as long as the engine has the bug,
whatever the ID; the adapter's hand-written assertions follow as extras."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.cache_machine import CacheMachine
from kvoracle.oracle.cache_machine import next_record as cache_record
from kvoracle.oracle import isolation, threads, watchdog
from kvoracle.oracle.campaign import RunResult, replay, reproducible
from kvoracle.oracle.engine import BadInput, Observation, Scripted, scheduler_view, view_of
from kvoracle.oracle.interrupts import stops
from kvoracle.oracle.isolation import Ended
from kvoracle.oracle.scheduler_machine import SchedulerMachine, drain_ticks, usable
from kvoracle.oracle.scheduler_machine import next_record as scheduler_record
from kvoracle.oracle.survival import ended_script
from kvoracle.oracle.tiered import Blocks, Call, action_of
from kvoracle.oracle.violations import PropertyViolated, described, raised_on_valid_call, refusal
from kvoracle.spec import invariants, liveness
from kvoracle.spec import state as spec_state
from kvoracle.spec import types as spec_types
from kvoracle.spec.invariants import Violation
from kvoracle.spec.refinement import refines, reports_ready
from kvoracle.spec.state import CacheState, System
from kvoracle.spec.types import Ok, RequestId
from kvoracle.spec.view import View, of_cache, of_system, request_name

_HEADER = "# kvoracle reproduction: {engine}, {id}"
_HEADER_LINE = re.compile(r"^# kvoracle reproduction: (\S+), (\S+)$", re.M)
_REQUEST = re.compile(r"\brequest (r\d+)\b")
_RANK = re.compile(r"^\[rank\d+\]:\s?")
_SUPPRESSED = re.compile(r"^with suppress\(Exception\):[^\n]*\n    ", re.S)
ENDED = "ProcessEnded"  # what a reproduction whose process was ended (no exception) failed with
HUNG_SLACK = 10.0  # at least: seconds a hang's reproduction gives its other calls beyond the step timeout (hung_limit)
TRANSITIONS = ("LIVE-EXIT", "BAD-INPUT", "LIVE-EVICT", "LIVE-ADMIT", "LIVE-PROGRESS")  # judged on the last call: the view before it is kept


def hung_limit() -> float:
    """How long a hang's reproduction lets its calls run: the step timeout for the call that
    hangs, as long again (HUNG_SLACK at least) for the others, none of which hung."""
    return watchdog.LIMIT[0] + max(watchdog.LIMIT[0], HUNG_SLACK)


def reproduction(machine: type[RuleBasedStateMachine], steps: Sequence[str], violation: PropertyViolated) -> str:
    """The file text: a header, the engine calls of `steps` replayed on a fresh engine
    (the last one, after which the check fired, run apart), the generated check of the
    property that fired, and the adapter's own assertions."""
    try:
        state = replay_state(machine, steps)
    except NotBuilt:
        return _build_reproduction(machine, steps, violation)
    adapter = adapter_of(state)
    pid = violation.first_id
    header = _header(getattr(adapter, "name", type(adapter).__name__), steps, violation,
                     "# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the",
                     "# engine has the bug.")
    preamble, *calls = adapter.script()
    cut = min(getattr(state, "mark", len(calls)), len(calls))  # the machines note it before each call
    source, live = adapter_source(type(adapter)), expected_live(state)
    record = ", ".join(f"{k}={v!r}" for k, v in checker_record(state, adapter, violation).items())
    body = ["# the engine calls of the shrunk program", *calls[:cut]]
    hung = watchdog.hung(violation)  # fail, not hang, while the engine has the bug
    if hung:
        body[:0] = [f"watch({hung_limit():g})  # a call hung the engine: fail with EngineHung, "
                    "not hang, once the calls below have run that long"]
    if pid in TRANSITIONS:
        body.append(f"_before = view_now({source!r}, globals(), live={live!r})")
    refining = _refining(state, pid)
    made = refining[1] if refining is not None and isinstance(refining[1], Call) else None  # cache level
    if refining is not None and made is None:  # scheduler level: the machine took the actions reported so far
        body.append(f"attached({source!r}, globals()).events()  # the spec actions the calls above reported")
    body.append("with Last() as _last:  # the call after which the check fired (what it raises is judged)")
    last = [_SUPPRESSED.sub("", line) if pid == "BAD-INPUT" else line for line in calls[cut:]]  # its refusal counts
    if made is not None:  # made through the adapter: its result names the step
        last = [f"_last.result = {made.source(f'attached({source!r}, globals())')}",
                *(f"# which runs: {line}" for line in "\n".join(last).splitlines())]
    body += [textwrap.indent(line, "    ") for line in last] or [
        "    pass  # the step ran no engine call: where this file passes, what failed ran in the adapter's own code"]
    if hung:
        body.append("watch(0)  # the calls are over")
    # what a bad call raises is its refusal, judged by BAD-INPUT alone; what a valid call raises is a finding
    # (a bad call's thread that died is a finding too)
    raised = "_last.error" if pid == "BAD-INPUT" or not _bad_call(violation.step) else "_last.death"
    call = f"{pid!r}, {source!r}, globals(), live={live!r}, raised={raised}"
    if pid in TRANSITIONS:
        call += f", before=_before, requests={sorted(set(_REQUEST.findall(str(violation))))!r}"
    if made is not None:
        call += ", result=_last.result"
    check = ["# kvoracle's check that fired, on the state the calls above left (generated)",
             f"fails_with({call}{', ' + record if record else ''})"]
    extras = getattr(adapter, "assertions", "").rstrip()
    outcomes = "from kvoracle.spec.types import Error, Ok, Partial, Timeout"  # a Call's arguments may name them
    imports = ["from kvoracle.oracle.findings import Last, attached, fails_with, view_now",
               *(["from kvoracle.oracle.watchdog import watch"] if hung else [])]
    if made is not None:
        imports += ["from kvoracle.oracle.tiered import Blocks, Call", *([outcomes] if outcomes not in preamble else [])]
    return "\n".join([*header, "", *beside(source, preamble), preamble, "", *imports, "",
                      *body, "", *check, "",
                      *(["# the adapter's own checks, in the engine's terms", extras, ""] if extras else [])])


def _refining(state: RuleBasedStateMachine, pid: str) -> tuple[CacheState, Call] | tuple[System, int] | None:
    """For a REFINEMENT found on the last call: the machine's record before it, and the
    call (cache level: a reproduction makes it again through the adapter, and applies the
    spec action its result names) or the ticks it let pass (scheduler level: the engine
    reports its actions itself). None for a REFINEMENT found between calls."""
    refining = getattr(state, "refining", None)
    return refining if pid == "REFINEMENT" and isinstance(refining, tuple) else None


def _build_reproduction(machine: type[RuleBasedStateMachine], steps: Sequence[str], violation: PropertyViolated) -> str:
    """The file text for a finding made while building the engine: the adapter built alone."""
    make = getattr(machine, "make_adapter", None)
    if not isinstance(make, type):
        raise TypeError(f"{machine.__name__} builds its engine with no adapter class: no reproduction can be written")
    source = adapter_source(make)
    header = _header(getattr(make, "name", make.__name__), steps, violation,
                     "# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the",
                     "# engine cannot be built.")
    return "\n".join([*header, "", "from kvoracle.oracle.engines import load_adapter",
                      "from kvoracle.oracle.findings import Last, fails_with", "",
                      "with Last() as _last:  # building the engine (what it raises is judged)",
                      f"    load_adapter({source!r})()", "",
                      f"fails_with({violation.first_id!r}, {source!r}, globals(), raised=_last.error)", ""])


def beside(source: str, preamble: str = "") -> list[str]:
    """For an adapter loaded from a file (FILE.py:CLASS): the lines that put its folder on
    sys.path, as loading it did in the campaign, so that the engine's modules beside it
    import when the reproduction runs from anywhere (none where its `preamble` names the
    folder itself)."""
    where = source.rpartition(":")[0]
    folder = str(Path(where).resolve().parent)
    if not where.endswith(".py") or folder in preamble:
        return []
    return ["import sys", f"sys.path.append({folder!r})  # the adapter's folder (its engine's modules)", ""]


def _header(engine: str, steps: Sequence[str], violation: PropertyViolated, *how_to_run: str) -> list[str]:
    """A reproduction's first lines: the engine and ID, the program, what it found, how to run it."""
    program = " ; ".join(s.removeprefix("state.") for s in steps) or "(no step: the program is empty)"
    return [_HEADER.format(engine=engine, id=violation.first_id), f"# found by: {program}",
            *(f"# {line}" for line in str(violation).splitlines()), *how_to_run]


def ended_reproduction(machine: type[RuleBasedStateMachine], steps: Sequence[str], violation: PropertyViolated,
                       engine: str, ended: Ended) -> str:
    """The file text for a program whose engine ended the process: the engine calls it
    made up to that (replayed in a process of their own, their script on disk before
    each call). Run alone, it ends its process the same way while the engine has the
    bug, and passes once the engine survives."""
    script = ended_script(machine, steps, ended).rstrip()
    make = getattr(machine, "make_adapter", None)
    return "\n".join([
        *_header(engine, steps, violation,
                 "# Run it in the engine's environment (kvoracle installed): it ends its process while the engine has",
                 "# the bug, and passes once the engine survives these calls."),
        "",
        *(beside(adapter_source(make), script) if script and isinstance(make, type) else []),
        script or "# the replay did not end the process: no engine calls to write",
        "",
    ])


def scripted(adapter: object) -> bool:
    """Whether an adapter class runs its calls from source text (oracle.engine.Scripted),
    which a reproduction replays; a factory that is no class is taken to (it is tried)."""
    return not isinstance(adapter, type) or issubclass(adapter, Scripted)


NOT_SCRIPTED = ("  no reproduction: the adapter does not derive from oracle.engine.Scripted, whose calls a file "
                "replays (docs/engines.md, \"Scripted\"); the numbered steps above are the program to replay")


def campaign_suffix(result: RunResult, bad_input: bool) -> str:
    """The part of a reproduction's name that tells the bad-input campaign's finding of a
    valid call from the valid-input campaign's (a bad call's step names itself)."""
    found = result.violation
    return "_bad_input" if bad_input and found is not None and not found.step.startswith("bad_input") else ""


def write_reproduction(machine: type[RuleBasedStateMachine], result: RunResult, repro_dir: Path, engine: str,
                       campaign: str = "") -> tuple[Path, str] | None:
    """Write the reproduction of a campaign's finding into `repro_dir` as
    <engine><campaign>_<step>_<id>.py and run it once: the path, and what it failed with;
    None when the result has no engine calls to replay (`reproducible`)."""
    if not reproducible(result) or not scripted(getattr(machine, "make_adapter", None)):
        return None
    assert result.violation is not None
    step = result.violation.step.removeprefix("bad_input:").replace(":", "_")
    name = f"{engine}{campaign}_{step}_{result.first_id.lower().replace('-', '_')}.py"
    path = repro_dir / re.sub(r"[^\w.]", "_", name)
    repro_dir.mkdir(parents=True, exist_ok=True)
    try:  # the replay runs the engine again: in a process of its own, whatever the engine does to it
        text = isolation.in_child(partial(_text, machine, result, engine))
        if isinstance(text, Ended):
            raise RuntimeError(f"the replay that writes it {text}")
    except BaseException as e:  # the finding stands and the campaign goes on: the file says why it is empty
        if stops(e):
            raise
        why = f"the reproduction could not be written: {described(e)}"
        lines = [*_header(engine, result.counterexample, result.violation), f"# {why}", *(
            f"# {line}" for line in traceback.format_exc().splitlines()), f"raise SystemExit({why!r})", ""]
        path.write_text("\n".join(lines), encoding="utf-8")
        return path, why
    path.write_text(with_hash_seed(text, os.environ.get("PYTHONHASHSEED", "")), encoding="utf-8")
    silent = result.ended is not None and result.ended.silent > 0
    hung = silent or watchdog.hung(result.violation)  # it fails late (watch) or hangs: wait less
    return path, run_reproduction(path, hung_limit() + 60 if hung else 300)


def _text(machine: type[RuleBasedStateMachine], result: RunResult, engine: str) -> str:
    assert result.violation is not None
    if result.ended is None:
        return reproduction(machine, result.counterexample, result.violation)
    return ended_reproduction(machine, result.counterexample, result.violation, engine, result.ended)


def with_hash_seed(text: str, seed: str) -> str:
    """The reproduction, run as a script, under the hash seed of the campaign that found it
    (`seed`, its PYTHONHASHSEED): an engine may order a set of strings by their hashes
    (vLLM 0.29's offloading jobs did), and Python draws that seed per process unless told.
    The lines go after the header comments; exec'd by another program the file runs as it is."""
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    if not seed.isdigit():
        pin = ["# The campaign ran under a random hash seed (PYTHONHASHSEED unset): an engine that orders sets",
               "# of strings by hash may not replay it exactly. `kvoracle check` runs under PYTHONHASHSEED=0."]
    else:
        pin = ["", "import os as _os, sys as _sys",
               f"if __name__ == '__main__' and _sys.argv[0] != '-c' and _os.environ.get('PYTHONHASHSEED') != {seed!r}:",
               "    # the campaign's hash seed: an engine may order sets of strings by hash",
               f"    _os.execve(_sys.executable, [_sys.executable, *_sys.argv], {{**_os.environ, 'PYTHONHASHSEED': {seed!r}}})"]
    return "\n".join([*lines[:at], *pin, *lines[at:]])


def standalone(path: Path, failure: str, first_id: str, finding: str = "") -> str:
    """The line that says what the reproduction did when it ran on its own (`finding`:
    the campaign's violation, as confirms reads it)."""
    confirmed = (f"fails standalone with {failure}" if confirms(failure, first_id, finding)
                 else f"does NOT fail standalone with {first_id}: {failure or 'it passes'}")
    return f"  reproduction: {path} ({confirmed})"


def checker_record(state: RuleBasedStateMachine, adapter: Scripted, violation: PropertyViolated) -> dict[str, object]:
    """What the check needs from the checker's own record, not the engine's: the spec
    state it expected (REFINEMENT), when it saw each transfer start (LIVE-TRANSFER), what
    the eviction asked for (LIVE-EVICT), what the scheduling step's queue needed and the
    steps in a row before it that stalled (LIVE-ADMIT; LIVE-PROGRESS: the running
    requests' needs), the refusal the bad call needed
    (BAD-INPUT)."""
    pid, model = violation.first_id, getattr(state, "model", None)
    refining = _refining(state, pid)
    if refining is not None:  # from the record before the last call (its step is judged again)
        before, made = refining
        return {"spec": repr(before), "step": violation.step, ("call" if isinstance(made, Call) else "ticks"): made}
    if pid == "REFINEMENT" and model is not None:
        return {"spec": repr(model)}
    if pid == "LIVE-TRANSFER":
        started = dict(model.started) if model is not None else dict(getattr(state, "seen", {}))
        now = model.now if model is not None else getattr(state, "clock", 0)
        if _literal(started):
            return {"started": started, "now": now, "timeout": getattr(adapter, "timeout", 0)}
    if pid == "LIVE-EVICT":
        return {"need": getattr(state, "asked", 1)}
    if pid == "LIVE-ADMIT" and isinstance(state, SchedulerMachine):
        needs, flying = state.admission
        return {"needs": needs, "room": usable(state.engine), "in_flight": flying,
                "stalled": list(state.streak.stalls[:-1])}
    if pid == "LIVE-PROGRESS" and isinstance(state, SchedulerMachine):
        return {"needs": state.growth, "room": usable(state.engine), "in_flight": state.admission[1],
                "furthest": state.furthest, "stalled": list(state.streak.standstills[:-1])}
    refusals = getattr(adapter, "refusals", None)
    kind = violation.step.removeprefix("bad_input:")
    if pid == "BAD-INPUT" and isinstance(refusals, Mapping) and kind in {k.value for k in refusals}:
        error = refusals[BadInput(kind)]
        return {"refusal": f"{error.__module__}:{error.__qualname__}"}
    return {}


def _bad_call(step: str) -> bool:
    """The step is a bad call: `bad_input:KIND` (request level) or the kind's name."""
    return step.startswith("bad_input:") or step in {k.value for k in BadInput}


def _literal(value: object) -> bool:
    try:
        return bool(ast.literal_eval(repr(value)) == value)
    except (ValueError, SyntaxError):
        return False


def adapter_of(state: RuleBasedStateMachine) -> Scripted:
    adapter = getattr(state, "adapter", None) or getattr(state, "engine", None)
    if not isinstance(adapter, Scripted):
        raise TypeError(f"{type(adapter).__name__} is not a Scripted adapter: no reproduction can be written")
    return adapter


def expected_live(state: RuleBasedStateMachine) -> dict[str, int] | None:
    """What the machine expected live (request -> tokens computed), where it keeps that
    (None: the engine's own statuses say)."""
    if isinstance(state, CacheMachine):
        return {request_name(r): held.placed * state.engine.block_size for r, held in state.live.items()}
    live = getattr(state, "live", None)
    if isinstance(live, dict) and all(isinstance(k, str) for k in live):
        return dict(live)
    return None


def adapter_source(cls: type) -> str:
    """MODULE:CLASS (or FILE.py:CLASS) of the nearest class a reproduction can import: a
    campaign's own subclass (one kind of bad input, a mutant) observes as its base does."""
    for c in cls.__mro__:
        if "kvoracle_source" in vars(c):
            return str(vars(c)["kvoracle_source"])
        try:
            if getattr(importlib.import_module(c.__module__), c.__qualname__, None) is c:
                return f"{c.__module__}:{c.__qualname__}"
        except ImportError:
            continue
    raise TypeError(f"no importable class in {cls.__name__}'s bases")


def replay_state(machine: type[RuleBasedStateMachine], steps: Sequence[str]) -> RuleBasedStateMachine:
    """A fresh machine after the steps (stopping at the violation, as the campaign did);
    its `mark` is the number of engine calls made before the last one."""
    holder: list[RuleBasedStateMachine] = []

    class Capturing(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            holder.append(self)

    found = replay(Capturing, steps)
    if not holder:
        raise NotBuilt(f"{machine.__name__} could not be built: {found}")
    return holder[0]


class NotBuilt(Exception):
    """The machine raised while building its engine: there is no state to replay to."""


# --- the generated check, run by a reproduction file -----------------------------------------------


def attached(source: str, namespace: dict[str, object]) -> Any:
    """The adapter class named by `source`, attached to the reproduction's namespace."""
    from kvoracle.oracle.engines import load_adapter

    cls = load_adapter(source)
    if not issubclass(cls, Scripted):
        raise TypeError(f"{source} is not a Scripted adapter")
    return cls.attach(namespace)


def view_now(source: str, namespace: dict[str, object], live: Mapping[str, int] | None) -> View:
    """The view the machine had of the engine: its observations (both tiers where the
    adapter has a CPU tier), with the requests the machine expected live."""
    adapter = attached(source, namespace)
    cpu: Observation | None = adapter.observe_cpu() if hasattr(adapter, "observe_cpu") else None
    if live is None and hasattr(adapter, "statuses"):
        held = [f"r{r}" for r, s in adapter.statuses().items() if s.value not in ("finished", "aborted")]
        return scheduler_view(adapter.observe(), cpu, held, adapter.block_size)
    return view_of(adapter.observe(), cpu, live, adapter.block_size)


class Last:
    """Runs a reproduction's last engine call: what it raises is kept for the check
    (an exception escaping a valid call is itself a finding), not thrown; so is the
    death of a thread of the engine's during the call (oracle.threads), where the
    engine left Python's own hook in place (one of its own keeps its deaths)."""

    error: Exception | None = None
    death: threads.ThreadDied | None = None  # a thread that died during the call, a bad call's too
    result: object = None  # what the call returned, where the check needs it (set by the file)
    watching = False

    def __enter__(self) -> Last:
        self.watching = threads.pythons_own()
        if self.watching:
            threads.watch()
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> bool:
        died = threads.died("the call") if self.watching else []
        if self.watching:
            threads.unwatch()
        self.death = threads.ThreadDied(died[0].message) if died else None
        if isinstance(error, Exception):
            self.error = error
            return True
        if error is None:
            self.error = self.death
        return False


def fails_with(pid: str, source: str, namespace: dict[str, object], live: Mapping[str, int] | None = None,
               before: View | None = None, requests: Sequence[str] = (), raised: Exception | None = None,
               **record: Any) -> None:
    """Raise AssertionError("<pid>: ...") when the engine's state breaks property `pid`,
    as kvoracle's machine found it (its first violation, by the same predicate). `raised`:
    what the last call raised; `record`: the checker's own record (checker_record)."""
    found = _violations(pid, Evidence(source, namespace, live, before, requests, raised, record))
    if found:  # chained to what the call raised, so that the engine's own traceback shows
        raise AssertionError(str(found[0]) + "".join(f"\n  {v}" for v in found[1:])) from raised
    if raised is not None and pid != "BAD-INPUT":  # a bad call's refusal is fine; a valid call's is not
        raise raised


@dataclass(frozen=True)
class Evidence:
    """What a reproduction hands its check: the engine (through the adapter named by
    `source`, attached to the file's namespace), and what was kept along the way."""

    source: str
    namespace: dict[str, object]
    live: Mapping[str, int] | None
    before: View | None
    requests: Sequence[str]
    raised: Exception | None
    record: Mapping[str, Any]

    def adapter(self) -> Any:
        return attached(self.source, self.namespace)

    def view(self) -> View:
        return view_now(self.source, self.namespace, self.live)


def _violations(pid: str, ev: Evidence) -> list[Violation]:
    if pid in invariants.SAFETY or pid == "INV-CONTENT":
        return [v for v in _safety(ev.adapter(), ev.view()) if v.id == pid]
    if pid == "VALID-INPUT":
        escaped = ev.raised
        if isinstance(escaped, threads.ThreadDied):
            return [Violation(pid, str(escaped))]
        return [] if escaped is None else [raised_on_valid_call("the engine", escaped)]
    if pid == "LIVE-DRAIN":
        return _drained(ev.adapter(), ev.live)
    if pid == "LIVE-TRANSFER" and "started" in ev.record:
        still = set(ev.adapter().transfers())
        started = {t: at for t, at in ev.record["started"].items() if t in still}
        return liveness.live_transfer(started, ev.record["now"], ev.record["timeout"])
    if pid == "REFINEMENT" and "spec" in ev.record:
        if ev.raised is not None:
            return []  # the call raised: that is the finding (fails_with raises it)
        r = ev.record
        return _refines(ev.adapter(), r["spec"], r.get("step", ""), r.get("call"), r.get("result"), r.get("ticks"))
    if ev.before is None or pid not in TRANSITIONS:
        raise ValueError(f"no generated check for {pid}: the reproduction shows the calls only")
    after = ev.view()
    if pid == "LIVE-EXIT":
        return [v for r in ev.requests for v in liveness.live_exit(ev.before, after, r)]
    if pid == "LIVE-EVICT":
        return _evicted(ev.before, after, ev.record.get("need", 1), ev.raised)
    if pid == "LIVE-ADMIT":
        r = ev.record
        why = liveness.stall(ev.before, after, r["needs"], r["room"], (r["in_flight"], len(ev.adapter().transfers())))
        return [] if why is None else liveness.live_admit([*r["stalled"], why])
    if pid == "LIVE-PROGRESS":
        r = ev.record
        in_flight = (r["in_flight"], len(ev.adapter().transfers()))
        why = liveness.standstill(ev.before, after, r["needs"], r["room"], in_flight, r["furthest"])
        return [] if why is None else liveness.live_progress([*r["stalled"], why])
    return _refused(ev.before, after, ev.raised, ev.record.get("refusal"))


def _safety(adapter: Any, observed: View) -> list[Violation]:
    """spec's safety properties on the abstraction (where the adapter gives one), the
    engine's own checks and KV content, then the observation: as the machines check."""
    found: list[Violation] = []
    if hasattr(adapter, "abstract") and (got := adapter.abstract()) is not None:
        found = invariants.check(of_cache(got))
    elif hasattr(adapter, "state") and (system := adapter.state()) is not None:
        found = invariants.check(of_system(system))
    for more in (getattr(adapter, "invariants", list)(), getattr(adapter, "content", list)(),
                 invariants.check(observed)):
        seen = {v.id for v in found}
        found += [v for v in more if v.id not in seen]
    return found


def _refines(adapter: Any, spec: str, step: str = "", call: Call | None = None, result: object = None,
             ticks: int | None = None) -> list[Violation]:
    """REFINEMENT: the engine's abstraction is the state the specification reached, and at
    the cache level what it says of each request's fill is spec's `ready` there. With the
    last call (cache level) or its ticks (scheduler level), `spec` is the record before
    that call, and the step the engine took is applied to it first, as the machine did."""
    want = eval(spec, {**vars(spec_state), **vars(spec_types)})  # the checker's record, as kvoracle printed it
    if isinstance(want, System):
        if ticks is not None:
            want = scheduler_record(want, step, ticks, adapter.events() or ())
            if isinstance(want, Violation):
                return [want]
        return refines(want, adapter.state())
    if call is not None:
        want = cache_record(want, step, action_of(call, result))
        if isinstance(want, Violation):
            return [want]
    found = refines(want, adapter.abstract())
    if hasattr(adapter, "ready"):  # the tiered cache level: what it says of each request's fill too
        in_flight = len(adapter.in_flight())
        found += [v for r in sorted(want.requests) for v in reports_ready(want, r, adapter.ready(r), in_flight)]
    return found


def _evicted(before: View, after: View, need: int, raised: Exception | None) -> list[Violation]:
    """LIVE-EVICT (spec's predicate) on the observations: the eviction evicted nothing
    when every evictable block is still there, still evictable."""
    if raised is not None:
        return liveness.live_evict(None, 0, need, None, raised=raised)
    was, now = before.gpu.evictable, after.gpu.evictable
    if now is None or now != was or before.gpu.cached != after.gpu.cached:
        return []  # something left the GPU, or the engine does not say
    return liveness.live_evict(None, len(was or ()), need, ())  # no step evicted anything


def _refused(before: View, after: View, raised: Exception | None, refusal_of: str | None) -> list[Violation]:
    """BAD-INPUT: the bad call changed nothing, and was refused with the declared error
    where the level declares one (the machines' own judgement, violations.refusal)."""
    if refusal_of is not None:
        module, _, name = refusal_of.partition(":")
        return refusal(getattr(importlib.import_module(module), name), raised, after != before)
    if after == before:
        return []
    return [Violation("BAD-INPUT", f"the bad call changed the state: {_changed(before, after)}")]


def _changed(before: View, after: View) -> str:
    parts = [f for f in ("tables", "live", "computed") if getattr(before, f) != getattr(after, f)]
    parts += [f"{t.name} {f}" for t, u in zip(before.tiers(), after.tiers()) for f in t.__dataclass_fields__
              if getattr(t, f) != getattr(u, f)]
    return ", ".join(parts) or "the view"


def _drained(adapter: Any, live: Mapping[str, int] | None) -> list[Violation]:
    """The drain the machine ran, through the adapter, then LIVE-DRAIN's predicate."""
    if hasattr(adapter, "statuses"):  # the scheduler level
        for r, s in sorted(adapter.statuses().items()):
            if s.value not in ("finished", "aborted"):
                adapter.abort(r, ())
        for _ in range(drain_ticks(adapter)):
            adapter.evict_all()
            adapter.tick(1)
    elif hasattr(adapter, "evict_gpu"):  # the cache level
        _drain_cache(adapter, live or {})
    else:  # the request level
        for rid in sorted(live or {}):
            adapter.finish(rid)
        if hasattr(adapter, "evict"):
            adapter.evict(len(adapter.observe().ids))
    cpu = adapter.observe_cpu() if hasattr(adapter, "observe_cpu") else None
    in_flight = len(adapter.transfers() if hasattr(adapter, "transfers") else getattr(adapter, "in_flight", list)())
    return liveness.drained(view_of(adapter.observe(), cpu), in_flight)


def _drain_cache(adapter: Any, live: Mapping[str, int]) -> None:
    """cache_machine.drain: release every request, then in rounds complete every
    transfer, evict the CPU tier, evict the GPU tier."""
    for name in sorted(live):
        adapter.release(RequestId(int(name.removeprefix("r"))), Blocks((), ()))
    for _ in range(liveness.drain_bound(adapter.gpu_blocks, adapter.cpu_blocks, len(live))):
        for job in adapter.in_flight():
            adapter.complete(job.transfer, Ok())
        adapter.evict_cpu(adapter.cpu_blocks)
        adapter.evict_gpu(adapter.gpu_blocks)


def run_reproduction(path: Path, timeout: float = 300) -> str:
    """Run the file with this Python; the first line of what it failed with, or ''."""
    code, stderr = _run_alone(path, timeout)
    if code is None:
        return f"{watchdog.EngineHung.__name__}: no answer within {timeout:g} s"
    if code == 0:
        return ""
    if code < 0 or "Traceback (most recent call last)" not in stderr:
        return f"{ENDED}: {Ended(code)}"  # no exception: the process was ended
    # a distributed engine's logger may prefix every line of stderr ("[rank0]: ", SGLang's)
    lines = [_RANK.sub("", line) for line in stderr.strip().splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("AssertionError")), None)
    return lines[first] if first is not None else (lines[-1] if lines else f"exit status {code}")


def _run_alone(path: Path, timeout: float) -> tuple[int | None, str]:
    """The file's exit status (None: still running after `timeout` s) and its stderr. It
    runs in a session of its own, written to a file, not a pipe: a process the engine
    forked and left running could hold a pipe open for ever; it is killed with the run."""
    with tempfile.TemporaryFile() as err:
        run = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.DEVNULL, stderr=err,
                               start_new_session=True)
        try:
            code: int | None = run.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        isolation.kill_group(run.pid)
        run.wait()
        err.seek(0)
        return code, err.read().decode(errors="replace")


_RAISED = re.compile(r"raised (\w+)\(")  # the exception a VALID-INPUT finding quotes (violations.described)


def confirms(failure: str, first_id: str, finding: str = "") -> bool:
    """What a reproduction failed with is the check of the property it was written for
    (for a call that hung or ended the process, VALID-INPUT: the reproduction does too);
    for a VALID-INPUT `finding` that quotes what was raised, the same exception's class,
    so that a reproduction failing for another reason (it cannot import the adapter, say)
    confirms nothing."""
    bare = re.sub(r"^[\w.]*\.(?=EngineHung\b)", "", failure)  # kvoracle.oracle.watchdog.EngineHung: ... raised by watch
    if first_id == "VALID-INPUT" and bare.startswith((watchdog.EngineHung.__name__, ENDED)):
        return True
    raised = _RAISED.search(finding) if first_id == "VALID-INPUT" else None
    return failure.startswith(f"AssertionError: {first_id}") and (raised is None or raised.group(0) in failure)


def header(text: str) -> tuple[str, str]:
    """The engine and the property ID a reproduction file names in its first line."""
    m = _HEADER_LINE.search(text)
    if m is None:
        raise ValueError("not a kvoracle reproduction: no header line")
    return m.group(1), m.group(2)
