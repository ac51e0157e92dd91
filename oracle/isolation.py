"""Work in a forked process of its own, so that whatever ends that process (os._exit, a
crash in native code, a signal, the OOM killer) ends only that piece of work: the
caller gets `Ended` in place of its result and goes on with the next piece.

An exception the work raises is not an ending: it is raised again in the caller, with
the child's traceback as a note (as `ChildFailed` when it does not pickle).

Each child leads a process group of its own: processes the work forks (an engine's
helpers) are killed with it when its piece is done, and they cannot keep the caller
waiting by holding the answer's pipe open: the answer is framed by its length, and the
caller also notices a child that exited.
"""

from __future__ import annotations

import os
import pickle
import selectors
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Ended:
    """A child that ended without answering: its exit status (>= 0) or -signal (None: a
    Ray worker, whose cluster does not say), and the seconds it ran."""

    status: int | None
    seconds: float = 0.0
    silent: float = 0.0  # > 0: it gave no sign of life for that long, and its parent killed it

    def __str__(self) -> str:
        if self.silent:
            return f"gave no sign of life for {self.silent:g} s (stuck where no timer reaches), so it was killed"
        if self.status is None:
            return "its worker died"
        if self.status < 0:
            try:
                return f"killed by {signal.Signals(-self.status).name}"
            except ValueError:
                return f"killed by signal {-self.status}"
        return f"exited with status {self.status}"


class ChildFailed(Exception):
    """The work raised in the child process (the message holds the child's traceback)."""


@dataclass
class _Child:
    pid: int
    fd: int
    data: bytearray
    started: float
    scratch: str  # the child's temporary directory, removed by the parent however the child ended
    beat: Path | None = None  # the file whose modification time is the child's sign of life
    silenced: float = 0.0  # the silence after which the parent killed it
    status: int | None = None  # its wait status, once it has exited and been reaped


def _start(work: Callable[[], object]) -> _Child:
    for stream in (sys.stdout, sys.stderr):  # else the child would write the parent's buffer again
        stream.flush()
    read, write = os.pipe()
    scratch = tempfile.mkdtemp(prefix="kvoracle-child-")
    pid = os.fork()
    if pid == 0:  # the child: run, answer, and leave at once (no atexit handlers, no parent's buffers)
        os.setpgid(0, 0)
        os.close(read)
        tempfile.tempdir = scratch  # what it leaves there (its finalizers never run) goes with it
        code = 0
        try:
            with os.fdopen(write, "wb") as out:
                answer = _answer(work)
                out.write(len(answer).to_bytes(8, "big") + answer)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
        except BaseException:
            code = 70  # an answer that cannot be sent: the parent reports it as an ending
        finally:
            os._exit(code)
    os.close(write)
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first
    except (PermissionError, ProcessLookupError):  # it has already exec'd or exited: its own call counted
        pass
    return _Child(pid, read, bytearray(), time.perf_counter(), scratch)


def _answered(child: _Child) -> bool:
    """The child's whole answer has arrived (its length, then that many bytes)."""
    data = child.data
    return len(data) >= 8 and len(data) >= 8 + int.from_bytes(data[:8], "big")


def _exited(child: _Child) -> bool:
    """The child has exited (reaped now): what it wrote is read, whoever else holds its pipe."""
    if child.status is None:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
        if pid == 0:
            return False
        child.status = status
    os.set_blocking(child.fd, False)
    try:
        while chunk := os.read(child.fd, 1 << 16):
            child.data += chunk
    except BlockingIOError:
        pass
    return True


def kill_group(leader: int) -> None:
    """Kill every process of the group `leader` leads (a child and what its work forked;
    none is left: nothing to do)."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read(child: _Child) -> bytes:
    """What the child's pipe holds now (b'': closed)."""
    chunk = os.read(child.fd, 1 << 16)
    child.data += chunk
    return chunk


def _answer(work: Callable[[], object]) -> bytes:
    """What the child sends: (True, result), or (False, (exception or None, traceback))."""
    try:
        return pickle.dumps((True, work()))
    except BaseException as e:
        trace = traceback.format_exc()
        try:
            return pickle.dumps((False, (e, trace)))
        except Exception:  # an exception that does not pickle: its traceback alone
            return pickle.dumps((False, (None, trace)))


def _finish(child: _Child) -> object:
    """The child's answer, once it has all arrived or the child has exited: its result, or Ended."""
    os.close(child.fd)
    answered = _answered(child)
    if child.status is None:
        child.status = os.waitpid(child.pid, 0)[1]
    kill_group(child.pid)  # what its work forked, still running
    shutil.rmtree(child.scratch, ignore_errors=True)
    if not answered:
        return Ended(os.waitstatus_to_exitcode(child.status), time.perf_counter() - child.started, child.silenced)
    ok, value = pickle.loads(bytes(child.data[8:]))
    if ok:
        return value
    error, trace = value
    if error is None:
        raise ChildFailed(f"the work failed in its process:\n{trace}")
    error.add_note(f"raised in a child process:\n{trace}")
    raise error


def in_child(work: Callable[[], R], beat: Path | None = None, quiet: float = 0) -> R | Ended:
    """work() in a child process: its result, or how the child ended without one (see
    in_children for `beat` and `quiet`)."""
    answer: R | Ended = next(in_children(lambda _: work(), [None], 1, [beat], quiet))
    return answer


def in_children(work: Callable[[T], R], pieces: Sequence[T], workers: int,
                beats: Sequence[Path | None] = (), quiet: float = 0) -> Iterator[R | Ended]:
    """work(piece) for every piece, each in a child process of its own, at most `workers`
    at once; yielded in the order of the pieces. With `quiet` > 0, a child whose file
    `beats[i]` has not been modified for `quiet` seconds (nor it started) is killed: it
    is stuck where nothing in it can notice."""
    results: dict[int, object] = {}
    running: dict[int, tuple[int, _Child]] = {}  # pipe -> (piece index, child)
    waiting, given = iter(enumerate(pieces)), 0
    selector = selectors.DefaultSelector()
    try:
        while given < len(pieces):
            while len(running) < max(1, workers) and (nxt := next(waiting, None)) is not None:
                child = _start(partial(work, nxt[1]))
                child.beat = beats[nxt[0]] if nxt[0] < len(beats) else None
                running[child.fd] = (nxt[0], child)
                selector.register(child.fd, selectors.EVENT_READ)
            for key, _ in selector.select(timeout=min(quiet / 4, 5.0) if quiet else 1.0):
                i, child = running[key.fd]
                if (chunk := _read(child)) and not _answered(child):
                    continue
                selector.unregister(child.fd)
                del running[child.fd]
                results[i] = _finish(child)
            for fd, (i, child) in list(running.items()):  # its pipe may stay open in what it forked
                if _exited(child):
                    selector.unregister(fd)
                    del running[fd]
                    results[i] = _finish(child)
            if quiet:
                _silence(running.values(), quiet)
            while given in results:
                yield results.pop(given)  # type: ignore[misc]
                given += 1
    finally:
        selector.close()
        for _, child in running.values():  # stopped early (an error, Ctrl-C): no child outlives the caller
            kill_group(child.pid)
            os.close(child.fd)
            if child.status is None:
                os.waitpid(child.pid, 0)
            shutil.rmtree(child.scratch, ignore_errors=True)


def _silence(running: Iterable[tuple[int, _Child]], quiet: float) -> None:
    """Kill each child silent for `quiet` seconds (its pipe then closes, and it is finished as Ended)."""
    now = time.time()
    for _, child in running:
        if child.beat is None or child.silenced:
            continue
        try:
            last = child.beat.stat().st_mtime
        except FileNotFoundError:
            last = 0.0
        if now - max(last, now - (time.perf_counter() - child.started)) > quiet:
            child.silenced = quiet
            os.kill(child.pid, signal.SIGKILL)
