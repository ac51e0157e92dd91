"""The model checker's queue of states still to visit, kept mostly pickled.

A search's frontier is its largest structure: on the re-admission scope it holds over a
million states. As objects a spec state takes about 3.9 KB; pickled together with a few
thousand others, about 380 bytes. So once the queue is long, it pickles every full chunk
of items as it fills, and unpickles one chunk at a time as the search reaches it: only
the newest and the oldest chunk are objects. Pickling and unpickling cost about 25 µs an
item with the cycle collector off (searches run with it off), about 5% of a state's
visit: a short queue (under SPILL items, 250 MB of states) keeps its chunks as objects.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

CHUNK = 4096  # items per chunk
SPILL = 65_536  # items in the queue beyond which full chunks are pickled


class Frontier(Generic[T]):
    """A first-in first-out queue whose middle is pickled chunks once it is long."""

    def __init__(self) -> None:
        self._empty()

    def _empty(self) -> None:
        self._newest: list[T] = []  # being filled
        self._chunks: deque[bytes | list[T]] = deque()  # full ones, oldest first, pickled when the queue is long
        self._oldest: deque[T] = deque()  # being taken from
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def append(self, item: T) -> None:
        self._newest.append(item)
        self._length += 1
        if len(self._newest) >= CHUNK:
            spill = self._length > SPILL
            self._chunks.append(pickle.dumps(self._newest, pickle.HIGHEST_PROTOCOL) if spill else self._newest)
            self._newest = []

    def popleft(self) -> T:
        if not self._oldest:
            if self._chunks:
                self._oldest = deque(_items(self._chunks.popleft()))
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
        lists = [list(self._oldest), *self._chunks, self._newest]
        self._empty()
        return [c if isinstance(c, bytes) else pickle.dumps(c, pickle.HIGHEST_PROTOCOL) for c in lists if c]


def _items(chunk: bytes | list[T]) -> list[T]:
    if isinstance(chunk, bytes):
        items: list[T] = pickle.loads(chunk)
        return items
    return chunk
