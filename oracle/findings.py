"""Turning an engine machine's counterexample into a standalone reproduction: the
engine calls the shrunk program made, then the adapter's checks in the engine's terms."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from kvoracle.oracle.campaign import replay
from kvoracle.oracle.engine_machine import EngineMachine
from kvoracle.oracle.violations import PropertyViolated

_HEADER = "# kvoracle reproduction: {engine}, {id}"
_HEADER_LINE = re.compile(r"^# kvoracle reproduction: (\S+), (\S+)$", re.M)


def reproduction(machine: type[EngineMachine], steps: Sequence[str], violation: PropertyViolated) -> str:
    """The file text: a header, the engine calls of `steps` replayed on a fresh engine,
    and the assertions that fail on the state they leave."""
    state = replay_state(machine, steps)
    adapter = state.adapter
    header = [
        _HEADER.format(engine=adapter.name, id=violation.first_id),
        f"# found by: {' ; '.join(s.removeprefix('state.') for s in steps)}",
        *(f"# {line}" for line in str(violation).splitlines()),
        "# Run it in the engine's environment; it fails with the ID above while the engine has the bug.",
    ]
    preamble, *calls = adapter.script()
    return "\n".join([*header, "", preamble, "", "# the engine calls of the shrunk program", *calls, "",
                      adapter.assertions.rstrip(), ""])


def replay_state(machine: type[EngineMachine], steps: Sequence[str]) -> EngineMachine:
    """A fresh machine after the steps (stopping at the violation, as the campaign did)."""
    holder: list[EngineMachine] = []

    class Capturing(machine):  # type: ignore[valid-type,misc]
        def __init__(self) -> None:
            super().__init__()
            holder.append(self)

    replay(Capturing, steps)
    return holder[0]


def run_reproduction(path: Path) -> str:
    """Run the file with this Python; the first line of what it failed with, or ''."""
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return ""
    last = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return last[-1] if last else f"exit status {done.returncode}"


def confirms(failure: str, first_id: str) -> bool:
    """What a reproduction failed with is the assertion of the property it was written for."""
    return failure.startswith(f"AssertionError: {first_id}")


def header(text: str) -> tuple[str, str]:
    """The engine and the property ID a reproduction file names in its first line."""
    m = _HEADER_LINE.search(text)
    if m is None:
        raise ValueError("not a kvoracle reproduction: no header line")
    return m.group(1), m.group(2)
