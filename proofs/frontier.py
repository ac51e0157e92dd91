"""The model checker's queue of states still to visit, kept mostly pickled.

A search's frontier is its largest structure: on the re-admission scope it holds over a
million states. As objects a spec state takes about 3.9 KB; pickled together with a few
thousand others, about 380 bytes. So the queue pickles every full chunk of items as it
fills, and unpickles one chunk at a time as the search reaches it: only the newest and
the oldest chunk are objects. Pickling and unpickling cost about 25 µs an item with the
cycle collector off (searches run with it off), a few percent of a state's visit.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

CHUNK = 4096  # items per pickled chunk


class Frontier(Generic[T]):
    """A first-in first-out queue whose middle is pickled chunks."""

    def __init__(self) -> None:
        self._empty()

    def _empty(self) -> None:
        self._newest: list[T] = []  # being filled
        self._chunks: deque[bytes] = deque()  # full ones, oldest first
        self._oldest: deque[T] = deque()  # being taken from
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def append(self, item: T) -> None:
        self._newest.append(item)
        self._length += 1
        if len(self._newest) >= CHUNK:
            self._chunks.append(pickle.dumps(self._newest, pickle.HIGHEST_PROTOCOL))
            self._newest = []

    def popleft(self) -> T:
        if not self._oldest:
            if self._chunks:
                self._oldest = deque(pickle.loads(self._chunks.popleft()))
            elif self._newest:
                self._oldest, self._newest = deque(self._newest), []
            else:
                raise IndexError("pop from an empty frontier")
        self._length -= 1
        return self._oldest.popleft()

    def drain(self) -> Iterator[T]:
        """Every item, oldest first, each taken off the queue as it is given."""
        while self._length:
            yield self.popleft()

    def chunks(self) -> list[bytes]:
        """Every item, as pickled lists, oldest first; the queue is then empty. What one
        worker sends another (the receiver unpickles one chunk at a time)."""
        out = [pickle.dumps(list(self._oldest), pickle.HIGHEST_PROTOCOL)] if self._oldest else []
        out += self._chunks
        if self._newest:
            out.append(pickle.dumps(self._newest, pickle.HIGHEST_PROTOCOL))
        self._empty()
        return out
