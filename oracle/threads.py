"""A thread of the engine that an exception kills is a finding.

An engine's background threads (storage I/O, swap executors, cache controllers) do a
call's work after the call returns; one that an exception kills takes that work with
it, and whatever it held is never released. Python hands such a death to
`threading.excepthook`, whose default prints it and goes on, so a campaign would see
only the effects, if any, steps later (a transfer that never answers: LIVE-TRANSFER).
From a machine's construction to its teardown (`watch`, `unwatch`) this module records
each death instead, and the machine reports the deaths after each call into the engine
as VALID-INPUT: a storage or swap error must never escape the engine, and one that
escapes a thread of its own has escaped. An adapter that installs a hook of its own
(to model what the dead thread stranded) takes the deaths over. A reproduction watches
its last call the same way, where the engine left Python's own hook in place.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from kvoracle.oracle.violations import PropertyViolated, described
from kvoracle.spec.invariants import Violation

Hook = Callable[[threading.ExceptHookArgs], object]

_deaths: list[tuple[str, threading.ExceptHookArgs]] = []  # recorded since the latest report
_older: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # threads alive when the program's build began
_replaced: list[Hook] = []  # the hook in place before the engine's build, until `unwatch` puts it back
_NUMBERED = re.compile(r"^(Thread|ThreadPoolExecutor|Dummy)-\d+(_\d+)?")  # a process-wide count


class ThreadDied(Exception):
    """A thread of the engine died during a reproduction's last call (oracle.findings.Last)."""


def _record(death: threading.ExceptHookArgs) -> None:
    if death.exc_type is SystemExit:  # a thread's own way to end (Python's hook ignores it too)
        return
    # a default thread name counts every thread the process made: not the same in a replay
    name = None if death.thread is None else _NUMBERED.sub(r"\1", death.thread.name)
    thread = "a thread" if name is None else f"thread {name!r}"
    if death.thread is not None and death.thread in _older:  # not this program's: it replays without it
        thread += ", left running by an earlier program or the harness,"
    raised = death.exc_type.__name__ if death.exc_value is None else described(death.exc_value)
    _deaths.append((f"{thread} died: it raised {raised}{_where(death.exc_traceback)}", death))


def _where(trace: TracebackType | None) -> str:
    """Where the exception was raised: the innermost frame (the thread's report is all
    an engine developer gets; its traceback is gone with the thread)."""
    if trace is None:
        return ""
    while trace.tb_next is not None:
        trace = trace.tb_next
    code = trace.tb_frame.f_code
    return f" at {'/'.join(Path(code.co_filename).parts[-2:])}:{trace.tb_lineno} in {code.co_name}"


@contextmanager
def building() -> Iterator[None]:
    """A machine's construction (its engine's build, its first looks at the engine), with
    the deaths of threads recorded from its start, as `watch` records them; that goes on
    after a construction that succeeds, until `unwatch` (the machine's teardown). A thread
    that died meanwhile is a finding (VALID-INPUT), raised as the construction ends; a
    construction that fails, or finds one, unwatches first (the machine has no teardown)."""
    watch()
    _older.update(threading.enumerate())  # a new program: what runs now is not its engine's
    try:
        yield
        found = died("the engine's build")
    except BaseException:
        unwatch()
        raise
    if found:
        unwatch()
        raise PropertyViolated("__init__", found)


def pythons_own() -> bool:
    """Whether Python's own hook is in place (no engine has installed one)."""
    return threading.excepthook is threading.__excepthook__


def watch() -> None:
    """Record the deaths of threads from now on (a new program: none recorded yet), until
    `unwatch` puts back the hook in place now. Call it before the engine is built: an
    adapter that installs a hook of its own as it builds the engine keeps it, and takes
    the deaths over."""
    _deaths.clear()
    _older.clear()
    if threading.excepthook is not _record:  # (_record left by a program that never unwatched: keep the older)
        _replaced[:] = [threading.excepthook]
    threading.excepthook = _record


def unwatch() -> None:
    """Put back the hook in place before the engine's build; if this module was still
    recording, give that hook the deaths recorded but never reported (a thread that died
    after the last check): it reports them as it would have."""
    left = _taken()
    if _replaced:
        recording = threading.excepthook is _record
        threading.excepthook = _replaced.pop()
        for _, death in left if recording else ():
            threading.excepthook(death)


def _taken() -> list[tuple[str, threading.ExceptHookArgs]]:
    """The deaths recorded so far, taken (one a thread records meanwhile stays)."""
    taken = _deaths[:]
    del _deaths[: len(taken)]
    return taken


def quiet() -> bool:
    """Whether no thread but the one running the machine is alive: then nothing but the
    machine's own calls runs code that changes the engine between two of them. Any other
    thread counts, the harness's or one an earlier program's engine left running, since it
    may be the engine's; native threads the engine starts outside Python are not seen."""
    return threading.active_count() == 1


def died(call: str) -> list[Violation]:
    """VALID-INPUT for each thread that died since the latest report (during `call`, or
    after the call before it returned)."""
    return [Violation("VALID-INPUT", f"by the end of {call}, {text}") for text, _ in _taken()]


def check(call: str) -> None:
    """Raise PropertyViolated where a thread died since the latest report."""
    found = died(call)
    if found:
        raise PropertyViolated(call, found)
