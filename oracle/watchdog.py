"""A call into the system under test that never returns is a finding, not a campaign
that never ends.

While a campaign runs (`watching`), every engine call the machines make starts a timer
(`kick`); a call still running after the limit (`kvoracle check --step-timeout`,
default 60 s) gets `EngineHung` raised inside it, which the machine reports as it
reports any exception escaping a valid call (VALID-INPUT, with the call's name), and
Hypothesis shrinks the program as usual. Once one call has hung, the limit drops to
AFTER_HANG for the rest of the run, or to ten times the longest call seen to return
where that is less (but not below AFTER_HANG_LEAST): the calls that follow (the machine's
look at the state, the final drain, the shrinker's hundred replays) may hang on the same
lock, and each costs that much instead of the full limit.

The timer is SIGALRM, so it works in the main thread of a POSIX process (a campaign's
own, or a worker's: processes run their jobs there); elsewhere nothing is watched. It
interrupts Python code and blocking waits (locks, queues, sleeps), not a C extension
that loops without returning to the interpreter: each `kick` is also a sign of life
(`beat_with`), which the parent of a campaign's process watches (oracle.survival).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

LIMIT = [60.0]  # seconds a call may run (kvoracle check --step-timeout; 0: unwatched)
AFTER_HANG = 2.0  # seconds a call may run once one has hung in this run, at most
AFTER_HANG_LEAST = 0.5  # ... and at least, however quick the calls before were
AFTER_HANG_TIMES = 10  # ... ten times the longest call seen to return, between the two
SLACK = 0.01  # a call may run this fraction beyond the limit, at most a second (_Timer)


class EngineHung(Exception):
    """A call into the system under test did not return within the limit."""

    def __init__(self, seconds: float) -> None:
        super().__init__("a call into the engine did not return within the step timeout")
        self.seconds = seconds  # the limit it ran out of (the message is the same whatever it was)


def check_limit(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"the step timeout must be at least 0 s (0: none), not {seconds:g}")


def set_limit(seconds: float) -> None:
    check_limit(seconds)
    LIMIT[0] = seconds


class _Timer:
    """Arms SIGALRM a slack beyond the limit (SLACK of it, at most a second), so that the
    calls that start within the slack still have the whole limit and need no system call
    of their own: a call gets at least the limit and at most the limit and the slack."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.due = 0.0  # when the armed timer fires (time.monotonic); 0: disarmed
        self.started = 0.0  # when the latest call started; 0: none since a program's end or a hang
        self.longest = 0.0  # the longest time from a call's start to the next's: no call that returned took longer

    def kick(self) -> None:
        now = time.monotonic()
        if self.started:
            self.longest = max(self.longest, now - self.started)
        self.started = now
        if now + self.seconds > self.due:
            armed = self.seconds + min(self.seconds * SLACK, 1.0)
            signal.setitimer(signal.ITIMER_REAL, armed)
            self.due = now + armed

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.due = 0.0
        self.started = 0.0  # what runs until the next call (Hypothesis's work) is no call

    def fire(self, signum: int, frame: FrameType | None) -> None:
        hung = self.seconds
        self.seconds = min(self.seconds, after_hang(self.longest))
        self.due = 0.0
        self.started = 0.0  # the hung call is not one that returned
        self.kick()  # what runs next (the machine's look, the drain) is watched too
        raise EngineHung(hung)


def after_hang(longest: float) -> float:
    """The limit once a call has hung, given the longest call seen to return (0: none seen,
    the engine's build, perhaps slow, may be next)."""
    if not longest:
        return AFTER_HANG
    return min(AFTER_HANG, max(AFTER_HANG_LEAST, AFTER_HANG_TIMES * longest))


_active: list[_Timer] = []  # the running campaign's timer, if any


_beats: list[Callable[[], None]] = []  # a campaign in a process of its own: the sign of life its parent watches


def beat_with(beat: Callable[[], None]) -> None:
    """Call `beat` as each engine call starts (oracle.survival: the parent of a process
    whose engine is stuck in native code, where SIGALRM cannot reach, sees no beat)."""
    _beats[:] = [beat]


def kick() -> None:
    """An engine call starts: it has the limit from now (a no-op outside `watching`)."""
    for beat in _beats:
        beat()
    if _active:
        _active[-1].kick()


def pause() -> None:
    """A program ended: nothing is watched until the next call (Hypothesis's own work
    between programs is not the engine's)."""
    if _active:
        _active[-1].disarm()


@contextmanager
def watching() -> Iterator[None]:
    """Watch the engine calls made inside: see the module's docstring."""
    usable = LIMIT[0] > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable or _active:
        yield
        return
    timer = _Timer(LIMIT[0])
    previous = signal.signal(signal.SIGALRM, timer.fire)
    _active.append(timer)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _active.pop()
        signal.signal(signal.SIGALRM, previous)


def watch(seconds: float) -> None:
    """A reproduction of a hang: once the engine calls that follow have run `seconds` in
    all, EngineHung is raised inside the one running, so a standalone run fails as the
    campaign did (in the main thread of a POSIX process); watch(0) disarms it."""
    def fire(signum: int, frame: FrameType | None) -> None:
        raise EngineHung(seconds)

    signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)  # 0: disarmed


def hung(finding: object) -> bool:
    """The finding is a call that hung (EngineHung, in its text)."""
    return EngineHung.__name__ in str(finding)
