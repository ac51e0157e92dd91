"""Ctrl-C stops a campaign; a KeyboardInterrupt the engine raises by itself is a finding.

Python turns SIGINT into KeyboardInterrupt, and an engine may raise one of its own (a
fatal-error handler that "interrupts" the server, a wrapper that re-raises a signal as
it). While a campaign runs (`listening`, in the main thread), this process's SIGINT
handler counts the signals it receives, then does what the handler it replaced did
(Python's own raises KeyboardInterrupt). A KeyboardInterrupt raised with no SIGINT
received is the engine's: the machines report it as any other exception escaping a
call (VALID-INPUT); one raised outside those calls leaves the program (`as_findings`)
and `listening` as EngineInterrupt, an ordinary exception, so Hypothesis shrinks it.
Where SIGINT was ignored or left to the system (a background job, `kvoracle check`'s
campaign processes, which Ctrl-C reaches through their parent), no SIGINT can raise one,
so every KeyboardInterrupt is the engine's. Where this cannot be told (outside
`listening`: another thread, pytest through `kvoracle.testing`; or an engine that
installed a SIGINT handler of its own meanwhile) every KeyboardInterrupt stops the run.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, ParamSpec, TypeVar

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

P = ParamSpec("P")
R = TypeVar("R")
_received = [0]  # SIGINTs this process received while listening
_left: list[Handler] = []  # the SIGINT handler `listening` left in place, while it listens


class EngineInterrupt(Exception):
    """A KeyboardInterrupt the engine raised with no SIGINT received, carried out of
    `listening` as an ordinary exception (its repr is the original's: a finding quotes it)."""

    def __init__(self, original: KeyboardInterrupt) -> None:
        super().__init__(*original.args)
        self.original = original

    def __repr__(self) -> str:
        return repr(self.original)


def stops(e: BaseException) -> bool:
    """Whether `e`, raised by a call into the engine, stops the campaign rather than being a
    finding: only Ctrl-C does. A GeneratorExit that escapes the engine is the engine's, as
    a SystemExit is: closing one of kvoracle's generators raises it at that generator's own
    `yield`, never inside a call into the engine."""
    return isinstance(e, KeyboardInterrupt) and not _engines_own()


def _engines_own() -> bool:
    """Whether a KeyboardInterrupt raised now can only be the engine's."""
    return bool(_left) and _received[0] == 0 and signal.getsignal(signal.SIGINT) is _left[0]


def as_findings(test: Callable[P, R]) -> Callable[P, R]:
    """`test` (the program Hypothesis runs), raising EngineInterrupt where the engine
    raised a KeyboardInterrupt of its own outside the machine's calls into it (as it is
    built, observed, torn down): Hypothesis stops at a KeyboardInterrupt, but shrinks
    a program that raises an ordinary exception."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with _carried_out():
            return test(*args, **kwargs)

    return run


@contextmanager
def _carried_out() -> Iterator[None]:
    """The engine's own KeyboardInterrupt leaves as EngineInterrupt; Ctrl-C as itself."""
    try:
        yield
    except KeyboardInterrupt as e:
        if stops(e):
            raise
        raise EngineInterrupt(e) from e


def _counting(previous: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
    def interrupted(signum: int, frame: FrameType | None) -> Any:
        _received[0] += 1
        return previous(signum, frame)
    return interrupted


@contextmanager
def listening() -> Iterator[None]:
    """Tell Ctrl-C from the engine's own KeyboardInterrupt inside: see the module's docstring."""
    if threading.current_thread() is not threading.main_thread() or _left:
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    handler = _counting(previous) if callable(previous) else previous  # ignored or the system's: left as it is
    try:
        if handler is not previous:
            signal.signal(signal.SIGINT, handler)
        _left.append(handler)
        _received[0] = 0
        with _carried_out():
            yield
    finally:
        _left.clear()
        if handler is not previous:
            signal.signal(signal.SIGINT, previous)
