"""The program a machine is running, on disk before each step runs: what is left of a
campaign whose engine ended the process (os._exit, a crash in native code, the OOM
killer). Hypothesis prints a program only after a step returns or raises, so a step that
never returns would otherwise leave nothing to replay.

Lines go to the file with one `write` system call each, no buffer in this process: the
kernel has them whatever ends the process next.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvoracle.oracle import stateful, watchdog
from kvoracle.oracle.random_programs import PRINTED

TEARDOWN = "state.teardown()"  # the last line when the process ended in the teardown (its drain)


class Journal:
    """A file of lines, appended to straight from this process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def restart(self) -> None:
        """Empty it: a new program (or a new engine script) starts."""
        os.ftruncate(self._fd, 0)

    def write(self, line: str) -> None:
        os.write(self._fd, (line.replace("\n", " ") + "\n").encode())

    def beat(self) -> None:
        """A sign of life without a line: the file's modification time is now."""
        os.utime(self._fd)

    def rewrite(self, lines: Sequence[str]) -> None:
        """Hold exactly `lines` (their text may span lines)."""
        os.ftruncate(self._fd, 0)
        os.write(self._fd, "".join(f"{line}\n" for line in lines).encode())

    def close(self) -> None:
        os.close(self._fd)


def read(path: Path) -> list[str]:
    """A journal's lines ([] when nothing was written, or no journal is there)."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def journaled(machine: type[RuleBasedStateMachine], journal: Journal) -> type[RuleBasedStateMachine]:
    """`machine` writing each program to `journal`: emptied as a program starts, then each
    step as Hypothesis prints it (`state.rule(arg=value, ...)`), written before the step
    runs, and TEARDOWN before the teardown. The rules, their arguments and preconditions
    are the same, so a seed draws the same programs."""
    body: dict[str, Any] = {"__init__": _restarting(machine, journal), "teardown": _noting_teardown(machine, journal)}
    for name, found in stateful.rules(machine).items():
        body[name] = _logged(name, found, journal)
    return type(machine.__name__, (machine,), body)


def _restarting(machine: type[RuleBasedStateMachine], journal: Journal) -> Callable[[Any], None]:
    def __init__(self: Any) -> None:
        journal.restart()
        watchdog.beat_with(journal.beat)  # each engine call is a sign of life too (a step may make many)
        machine.__init__(self)
    return __init__


def _noting_teardown(machine: type[RuleBasedStateMachine], journal: Journal) -> Callable[[Any], None]:
    def teardown(self: Any) -> None:
        journal.write(TEARDOWN)
        self._in_step = True  # the drain calls rules as helpers
        try:
            machine.teardown(self)
        finally:
            self._in_step = False
    return teardown


_PLAIN = (int, bool, str, type(None))  # printed as repr() prints them; Hypothesis's printer is slow


def _shown(machine: Any, value: object) -> str:
    """The value as Hypothesis prints it in a program (a mapped value as the call that
    made it: `_faults(12)`)."""
    return repr(value) if type(value) in _PLAIN else str(machine._pretty_print(value))


def _logged(name: str, found: Any, journal: Journal) -> object:
    """The rule `found` (a Hypothesis Rule) with a body that journals the step first (a
    rule that one step calls as a helper is part of that step, not one of its own)."""
    def step(self: Any, *given: object, **arguments: object) -> object:
        if getattr(self, "_in_step", False):
            return found.function(self, *given, **arguments)
        printed = self.__dict__.pop(PRINTED, None)  # the random generator printed the step itself
        if printed is None:
            shown = ", ".join([*(_shown(self, v) for v in given),
                               *(f"{k}={_shown(self, v)}" for k, v in arguments.items())])
            printed = f"state.{name}({shown})"
        journal.write(printed)
        self._in_step = True
        try:
            return found.function(self, *given, **arguments)
        finally:
            self._in_step = False
    step.__name__ = step.__qualname__ = name
    as_rule: Callable[..., Callable[[Callable[..., object]], object]] = rule  # with the strategies of `found`
    as_precondition: Callable[[Any], Callable[[Any], object]] = precondition
    made = as_rule(**found.arguments)(step)
    for condition in found.preconditions:
        made = as_precondition(condition)(made)
    return made
