"""A campaign's sign of progress while it runs: one target's campaign can take minutes
(a slow engine, a hang's shrinking), and the per-target progress line says nothing until
it ends. Its process says, every so often, how many programs and steps it ran and,
once a program failed, that it is shrinking that one.

On a terminal the line is redrawn in place, every second (the campaign's progress bar
takes the line back when a target ends); in a log, a line every PERIOD seconds.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO

from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine

PERIOD = 30.0  # seconds between two lines in a log
ON_TERMINAL = 1.0  # and between two redraws on a terminal


class Pulse:
    """One campaign's count of programs and of failed ones, shown every `period` seconds."""

    def __init__(self, label: str, out: TextIO | None = None, period: float | None = None) -> None:
        self.label = label
        self.out = out if out is not None else sys.stderr
        self.terminal = self.out.isatty()
        self.period = period if period is not None else ON_TERMINAL if self.terminal else PERIOD
        self.start = self.last = time.monotonic()
        self.programs = 0
        self.failed_at: tuple[int, float] | None = None  # programs and seconds when the first one failed

    def program(self, steps: int) -> None:
        """A program starts (`steps`: the machine's steps so far)."""
        self.programs += 1
        now = time.monotonic()
        if now - self.last >= self.period:
            self.last = now
            self._show(steps, now - self.start)

    def failed(self) -> None:
        """The program running failed: the runs from here on shrink it."""
        if self.failed_at is None:
            self.failed_at = (self.programs, time.monotonic() - self.start)

    def line(self, steps: int, seconds: float) -> str:
        ran = f"{self.label}: {self.programs:,} programs, {steps:,} steps, {seconds:,.0f} s"
        if self.failed_at is None:
            return ran
        programs, at = self.failed_at
        return (f"{ran}; shrinking program {programs:,}'s failure (found at {at:,.0f} s): "
                f"{self.programs - programs:,} replays in {seconds - at:,.0f} s")

    def _show(self, steps: int, seconds: float) -> None:
        text = self.line(steps, seconds)
        if self.terminal:  # within one row: a wrapped line could not be redrawn in place
            width = shutil.get_terminal_size().columns - 1
            self.out.write(f"\r{text[:width]:<{width}}")
        else:
            self.out.write(f"kvoracle: {text}\n")
        self.out.flush()


def pulsing(machine: type[RuleBasedStateMachine], pulse: Pulse) -> type[RuleBasedStateMachine]:
    """`machine` telling `pulse` when each program starts and when one fails (its
    teardown runs however the program ended, and sees the exception that ended it)."""
    def __init__(self: Any) -> None:
        tally = getattr(type(self), "tally", None)
        pulse.program(getattr(tally, "steps", 0))
        machine.__init__(self)

    def teardown(self: Any) -> None:
        try:
            machine.teardown(self)
        except BaseException as e:
            if failure(e):
                pulse.failed()
            raise
        if failure(sys.exc_info()[1]):
            pulse.failed()

    return type(machine.__name__, (machine,), {"__init__": __init__, "teardown": teardown})


def failure(e: BaseException | None) -> bool:
    """Whether a program that ended with `e` failed: not Hypothesis's own signals (a
    rejected program, data run out while shrinking) nor Ctrl-C."""
    return isinstance(e, Exception) and not isinstance(e, HypothesisException)
