"""Where a campaign's independent pieces run: in this process, on N processes of this
machine, or on a Ray cluster (the optional extra `kvoracle[ray]`). The results come back
in the order the pieces were given, whatever ran them, and each piece runs the same
seeds wherever it runs: verdicts and shrunk counterexamples do not depend on where.
"""

from __future__ import annotations

import importlib
import multiprocessing
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

LOCAL = "local"  # --ray local: start a Ray cluster on this machine for the run


class ClusterUnavailable(Exception):
    """Ray is not installed, or no cluster answers at the address given."""


def in_order(work: Callable[[T], R], pieces: Sequence[T], workers: int = 1, ray: str | None = None) -> Iterator[R]:
    """work(piece) for every piece, yielded in order: on the Ray cluster at `ray` when
    given, else on `workers` processes (1: this one)."""
    if ray is not None:
        yield from _on_ray(work, pieces, ray)
    elif workers <= 1:
        yield from map(work, pieces)
    else:
        # fork: the children inherit what the parent loaded (adapters from files included)
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            yield from pool.map(work, pieces)


def _on_ray(work: Callable[[T], R], pieces: Sequence[T], address: str) -> Iterator[R]:
    ray = _ray()
    ours = not ray.is_initialized()  # a caller's own Ray session is used as it is, and left running
    if ours:
        _answers(address)
        try:  # Ray reads "local" as: start a new cluster on this machine
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ClusterUnavailable(f"no Ray cluster at {address!r}: {e}") from e
    try:
        remote = ray.remote(work)
        started = [remote.remote(piece) for piece in pieces]  # all submitted first: they run at once
        for ref in started:
            result: R = ray.get(ref)
            yield result
    finally:
        if ours:
            ray.shutdown()


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
