"""Turning a machine's counterexample into a standalone reproduction: the engine calls
the shrunk program made (a Scripted adapter records them as source text), then the
check that fired, generated: kvoracle's own predicate for that property ID, evaluated on
the state the calls left, through the adapter's observation code. So a reproduction
fails with the campaign's ID for as long as the engine has the bug, whatever the ID; the
adapter's hand-written assertions follow as extras."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.campaign import replay
from kvoracle.oracle.engine import Observation, Scripted, view_of
from kvoracle.oracle.violations import PropertyViolated
from kvoracle.spec import invariants, liveness
from kvoracle.spec.invariants import Violation
from kvoracle.spec.view import View

_HEADER = "# kvoracle reproduction: {engine}, {id}"
_HEADER_LINE = re.compile(r"^# kvoracle reproduction: (\S+), (\S+)$", re.M)
_REQUEST = re.compile(r"\brequest (r\d+)\b")
TRANSITIONS = ("LIVE-EXIT", "BAD-INPUT")  # IDs a reproduction judges on its last step


def reproduction(machine: type[RuleBasedStateMachine], steps: Sequence[str], violation: PropertyViolated) -> str:
    """The file text: a header, the engine calls of `steps` replayed on a fresh engine,
    the generated check of the property that fired, and the adapter's own assertions."""
    state, boundaries = replay_state(machine, steps)
    adapter = adapter_of(state)
    pid = violation.first_id
    header = [
        _HEADER.format(engine=getattr(adapter, "name", type(adapter).__name__), id=pid),
        f"# found by: {' ; '.join(s.removeprefix('state.') for s in steps)}",
        *(f"# {line}" for line in str(violation).splitlines()),
        "# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the",
        "# engine has the bug.",
    ]
    preamble, *calls = adapter.script()
    source, live = adapter_source(type(adapter)), expected_live(state)
    call = f"{pid!r}, {source!r}, globals(), live={live!r}"
    body = ["# the engine calls of the shrunk program", *calls]
    if pid in TRANSITIONS:  # judged on a step: the state before the last one is kept
        cut = boundaries[-1] if boundaries else len(calls)
        exited = sorted(set(_REQUEST.findall(str(violation))))
        body = ["# the engine calls of the shrunk program", *calls[:cut],
                "from kvoracle.oracle.findings import view_now",
                f"_before = view_now({source!r}, globals(), live={live!r})", *calls[cut:]]
        call += f", before=_before, requests={exited!r}"
    check = ["# kvoracle's check that fired, on the state the calls above left (generated)",
             "from kvoracle.oracle.findings import fails_with, view_now", f"fails_with({call})"]
    extras = getattr(adapter, "assertions", "").rstrip()
    return "\n".join([*header, "", preamble, "", *body, "", *check, "",
                      *(["# the adapter's own checks, in the engine's terms", extras, ""] if extras else [])])


def adapter_of(state: RuleBasedStateMachine) -> Scripted:
    adapter = getattr(state, "adapter", None) or getattr(state, "engine", None)
    if not isinstance(adapter, Scripted):
        raise TypeError(f"{type(adapter).__name__} is not a Scripted adapter: no reproduction can be written")
    return adapter


def expected_live(state: RuleBasedStateMachine) -> dict[str, int] | None:
    """What the machine expected live (request -> tokens computed), where it keeps that."""
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


def replay_state(machine: type[RuleBasedStateMachine], steps: Sequence[str]) -> tuple[RuleBasedStateMachine, list[int]]:
    """A fresh machine after the steps (stopping at the violation, as the campaign did),
    and the number of engine calls made before each step."""
    holder: list[RuleBasedStateMachine] = []
    boundaries: list[int] = []

    class Capturing(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            holder.append(self)

    def noting(step: str) -> str:
        return f"(_note(), {step})[1]"

    def note() -> None:
        boundaries.append(len(adapter_of(holder[0]).lines))

    replay(Capturing, [noting(s) for s in steps], {"_note": note})
    return holder[0], boundaries


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
        live = {f"r{r}": 0 for r, s in adapter.statuses().items() if s.value not in ("finished", "aborted")}
    return view_of(adapter.observe(), cpu, live, adapter.block_size)


def fails_with(pid: str, source: str, namespace: dict[str, object], live: Mapping[str, int] | None = None,
               before: View | None = None, requests: Sequence[str] = ()) -> None:
    """Raise AssertionError("<pid>: ...") when the engine's state breaks property `pid`,
    as kvoracle's machine found it (its first violation, by the same predicate)."""
    found = _violations(pid, source, namespace, live, before, requests)
    if found:
        raise AssertionError(str(found[0]) + "".join(f"\n  {v}" for v in found[1:]))


def _violations(pid: str, source: str, namespace: dict[str, object], live: Mapping[str, int] | None,
                before: View | None, requests: Sequence[str]) -> list[Violation]:
    if pid in invariants.SAFETY:
        return [v for v in invariants.SAFETY[pid](view_now(source, namespace, live)) if v.id == pid]
    if pid == "LIVE-EXIT" and before is not None:
        after = view_now(source, namespace, live)
        return [v for r in requests for v in liveness.live_exit(before, after, r)]
    if pid == "BAD-INPUT" and before is not None:  # the last step was a bad call: it must change nothing
        after = view_now(source, namespace, live)
        return [] if after == before else [Violation("BAD-INPUT", f"the bad call changed the state: {_changed(before, after)}")]
    if pid == "LIVE-DRAIN":
        return _drained(attached(source, namespace), live)
    raise ValueError(f"no generated check for {pid}: the reproduction shows the calls only")


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
        for _ in range(adapter.timeout + 8):
            adapter.evict_all()
            adapter.tick(1)
    else:  # the request level
        for rid in sorted(live or {}):
            adapter.finish(rid)
        if hasattr(adapter, "evict"):
            adapter.evict(len(adapter.observe().ids))
    cpu = adapter.observe_cpu() if hasattr(adapter, "observe_cpu") else None
    in_flight = len(adapter.transfers()) if hasattr(adapter, "transfers") else 0
    return liveness.drained(view_of(adapter.observe(), cpu), in_flight)


def run_reproduction(path: Path) -> str:
    """Run the file with this Python; the first line of what it failed with, or ''."""
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return ""
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("AssertionError")), None)
    return lines[first] if first is not None else (lines[-1] if lines else f"exit status {done.returncode}")


def confirms(failure: str, first_id: str) -> bool:
    """What a reproduction failed with is the check of the property it was written for."""
    return failure.startswith(f"AssertionError: {first_id}")


def header(text: str) -> tuple[str, str]:
    """The engine and the property ID a reproduction file names in its first line."""
    m = _HEADER_LINE.search(text)
    if m is None:
        raise ValueError("not a kvoracle reproduction: no header line")
    return m.group(1), m.group(2)
