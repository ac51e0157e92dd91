"""Ctrl-C stops a campaign; a KeyboardInterrupt the engine raises by itself is a finding.

Python turns SIGINT into KeyboardInterrupt, and an engine may raise one of its own (a
fatal-error handler that "interrupts" the server, a wrapper that re-raises a signal as
it). While a campaign runs (`listening`), this process's SIGINT handler counts the
signals it receives before raising as Python's own does: a KeyboardInterrupt that
escapes an engine call with no SIGINT received is the engine's, and the machines report
it as they report any other exception escaping a call (VALID-INPUT). Outside `listening`
(a thread other than the main one, pytest through `kvoracle.testing`, a SIGINT handler
of someone else's that is not Python's) every KeyboardInterrupt stops the run, as
GeneratorExit (a generator's close) always does.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_listening = [False]
_received = [0]  # SIGINTs this process received while listening


def stops(e: BaseException) -> bool:
    """Whether `e`, raised by a call into the engine, stops the campaign rather than being a finding."""
    if isinstance(e, GeneratorExit):
        return True
    return isinstance(e, KeyboardInterrupt) and (not _listening[0] or _received[0] > 0)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    _received[0] += 1
    signal.default_int_handler(signum, frame)


@contextmanager
def listening() -> Iterator[None]:
    """Tell Ctrl-C from the engine's own KeyboardInterrupt inside: see the module's docstring."""
    usable = threading.current_thread() is threading.main_thread() and not _listening[0]
    previous = signal.getsignal(signal.SIGINT) if usable else None
    if previous is not signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, _interrupted)
    _listening[0], _received[0] = True, 0
    try:
        yield
    finally:
        _listening[0] = False
        signal.signal(signal.SIGINT, previous)
