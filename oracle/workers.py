"""Where a campaign's independent pieces run: in this process, on N processes of this
machine, or on a Ray cluster (the optional extra `kvoracle[ray]`). The results come back
in the order the pieces were given, whatever ran them, and each piece runs the same
seeds wherever it runs: verdicts and shrunk counterexamples do not depend on where.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import shutil
import socket
import tempfile
import traceback
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kvoracle.oracle.isolation import Ended, in_children

T = TypeVar("T")
R = TypeVar("R")

LOCAL = "local"  # --ray local: start a Ray cluster on this machine for the run
SCRATCH = "kvoracle-ray-"  # a Ray piece's temporary directory: this, the worker's pid, a dash, a random part


class ClusterUnavailable(Exception):
    """Ray is not installed, or no cluster answers at the address given."""


def in_order(work: Callable[[T], R], pieces: Sequence[T], workers: int = 1, ray: str | None = None) -> Iterator[R]:
    """work(piece) for every piece, yielded in order: on the Ray cluster at `ray` when
    given, else on `workers` processes (1: this one). A process that ends without an
    answer is an error here (each_alone makes it a result)."""
    if ray is None and workers <= 1:
        yield from map(work, pieces)
        return
    for answer in each_alone(work, pieces, workers, ray):
        if isinstance(answer, Ended):
            raise RuntimeError(f"a worker process {answer} (killed for memory, say)")
        yield answer


def each_alone(work: Callable[[T], R], pieces: Sequence[T], workers: int = 1, ray: str | None = None,
               beats: Sequence[Path | None] = (), quiet: float = 0) -> Generator[R | Ended, None, None]:
    """work(piece) for every piece, each in a process of its own (forked: it inherits what
    this one loaded, adapters from files included), at most `workers` at once, yielded
    in order; a piece whose process ended without answering yields Ended, and the rest
    go on (on the Ray cluster at `ray` too, as Ended with no status: Ray does not say).
    `beats` and `quiet`: a local piece silent that long is killed (isolation.in_children)."""
    if ray is not None:
        yield from _on_ray(work, pieces, ray)
    else:
        yield from in_children(work, pieces, workers, beats, quiet)


@contextmanager
def session(address: str | None) -> Iterator[None]:
    """One Ray session for every search and campaign of a run (each would otherwise
    connect on its own, and with `local` start a cluster of its own), ended after it;
    nothing without an address, or where the caller's own session is already up."""
    if address is None:
        yield
        return
    ray = _ray()
    ours = not ray.is_initialized()
    if ours:
        _connect(ray, address)
    try:
        yield
    finally:
        if ours:
            ray.shutdown()


def _on_ray(work: Callable[[T], R], pieces: Sequence[T], address: str) -> Iterator[R | Ended]:
    ray = _ray()
    ours = not ray.is_initialized()  # a caller's own Ray session is used as it is, and left running
    if ours:
        _connect(ray, address)
    died = (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError)
    try:
        remote = ray.remote(max_retries=0)(_in_scratch)  # a worker the piece ended is its result: no retry
        started = [remote.remote(work, piece) for piece in pieces]  # all submitted first: they run at once
        for ref in started:
            try:
                result: R = ray.get(ref)
            except died:
                yield Ended(None)
                continue
            yield result
    finally:
        if ours:
            ray.shutdown()


def _in_scratch(work: Callable[[T], R], piece: T) -> R:
    """A piece on a Ray worker, its temporary files in a directory of its own that goes
    when it answers (Ray ends its workers without running their finalizers). A worker
    killed mid-piece cannot remove its directory: the name holds the worker's pid, and
    the next piece on that machine removes the directories of workers no longer alive."""
    base = Path(tempfile.gettempdir())
    _sweep_orphans(base)
    where = tempfile.mkdtemp(prefix=f"{SCRATCH}{os.getpid()}-", dir=base)
    before, tempfile.tempdir = tempfile.tempdir, where
    try:
        return work(piece)
    finally:
        tempfile.tempdir = before
        shutil.rmtree(where, ignore_errors=True)


def _sweep_orphans(base: Path) -> None:
    for orphan in base.glob(f"{SCRATCH}*-*"):
        pid = orphan.name.removeprefix(SCRATCH).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(orphan, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _connect(ray: Any, address: str) -> None:
    _answers(address)
    try:  # Ray reads "local" as: start a new cluster on this machine
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterUnavailable(f"no Ray cluster at {address!r}: {e}") from e


def _answers(address: str, seconds: float = 5.0) -> None:
    """Refuse at once an address of the form [ray://]HOST:PORT where nothing listens: Ray
    itself keeps retrying for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379
    if not host or not port.isdigit():
        return  # "local", "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as e:
        raise ClusterUnavailable(f"no Ray cluster at {address!r}: {e}") from e


def _ray() -> Any:  # Ray's API is untyped here; imported only when asked for
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise ClusterUnavailable("Ray is not installed: pip install 'kvoracle[ray]'") from e


class Team:
    """Stateful workers called round by round: worker i is `cls(*args[i])`, in a process of
    its own on this machine, or a Ray actor on the cluster at `ray`. `call` runs one method
    on every worker at once and returns the results in worker order."""

    def __init__(self, cls: type, args: Sequence[tuple[Any, ...]], ray: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        """`env`: environment variables a Ray actor needs from its start (a local worker is
        forked, and has the parent's)."""
        self._ray: Any = None
        self._ours = False
        if ray is not None:
            self._ray = _ray()
            self._ours = not self._ray.is_initialized()
            if self._ours:
                _connect(self._ray, ray)
            actor = self._ray.remote(cls).options(runtime_env={"env_vars": env or {}})
            self._actors = [actor.remote(*a) for a in args]
            return
        context = multiprocessing.get_context("fork")
        self._pipes: list[Any] = []
        self._processes: list[Any] = []
        for a in args:
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, cls, a), daemon=True)
            process.start()
            self._pipes.append(ours)
            self._processes.append(process)

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._ray is not None:
            return list(self._ray.get([getattr(w, method).remote(*a) for w, a in zip(self._actors, args)]))
        for pipe, a in zip(self._pipes, args):
            pipe.send((method, a))
        return [_answer(pipe, method) for pipe in self._pipes]

    def call_one(self, i: int, method: str, args: tuple[Any, ...]) -> Any:
        """One method on worker i alone."""
        if self._ray is not None:
            return self._ray.get(getattr(self._actors[i], method).remote(*args))
        self._pipes[i].send((method, args))
        return _answer(self._pipes[i], method)

    def close(self) -> None:
        if self._ray is not None:
            for w in self._actors:
                self._ray.kill(w)
            if self._ours:
                self._ray.shutdown()
            return
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:  # the worker died (killed for memory, say): its error is already raised
                pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()

    def __enter__(self) -> Team:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _answer(pipe: Any, method: str) -> Any:
    try:
        ok, result = pipe.recv()
    except EOFError as e:
        raise RuntimeError(f"a worker died in {method} (killed for memory, say)") from e
    if not ok:
        raise RuntimeError(f"a worker failed in {method}:\n{result}")
    return result


def _serve(pipe: Any, cls: type, args: tuple[Any, ...]) -> None:
    """A local worker: build the object, then answer calls until told to stop."""
    try:
        worker = cls(*args)
    except Exception:
        worker = None
        failure = traceback.format_exc()
    while (message := pipe.recv()) is not None:
        if worker is None:
            pipe.send((False, failure))
            continue
        method, a = message
        try:
            pipe.send((True, getattr(worker, method)(*a)))
        except Exception:
            pipe.send((False, traceback.format_exc()))
