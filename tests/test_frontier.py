"""The model checker's frontier: a first-in first-out queue, whatever is pickled inside."""

from __future__ import annotations

import pickle
from collections import deque

import pytest
from hypothesis import given, strategies as st

from kvoracle.proofs import frontier
from kvoracle.proofs.frontier import Frontier


@given(ops=st.lists(st.one_of(st.integers(0, 10**6), st.none()), max_size=200), chunk=st.integers(1, 7),
       spill=st.integers(0, 30))
def test_the_frontier_is_a_fifo_queue(ops: list[int | None], chunk: int, spill: int) -> None:
    """Appends (an int) and pops (None), interleaved, across chunk boundaries, with chunks
    kept as objects and pickled: the frontier gives what a deque gives, in the same
    order, and its length is the deque's."""
    saved = frontier.CHUNK, frontier.SPILL
    frontier.CHUNK, frontier.SPILL = chunk, spill
    try:
        queue: Frontier[int] = Frontier()
        expected: deque[int] = deque()
        for op in ops:
            if op is not None:
                queue.append(op)
                expected.append(op)
            elif expected:
                assert queue.popleft() == expected.popleft()
            assert len(queue) == len(expected)
        assert list(queue.drain()) == list(expected)
        assert len(queue) == 0
    finally:
        frontier.CHUNK, frontier.SPILL = saved


@pytest.mark.parametrize("spill", [0, 1000])
def test_chunks_give_every_item_once_in_order_and_empty_the_queue(spill: int) -> None:
    """Pickled chunks (spill 0) or not (1000): chunks() gives every item still queued."""
    saved = frontier.CHUNK, frontier.SPILL
    frontier.CHUNK, frontier.SPILL = 3, spill
    try:
        queue: Frontier[tuple[int, str]] = Frontier()
        for i in range(10):
            queue.append((i, str(i)))
        assert queue.popleft() == (0, "0")  # the oldest chunk is now objects, partly taken
        chunks = queue.chunks()
        assert [item for c in chunks for item in pickle.loads(c)] == [(i, str(i)) for i in range(1, 10)]
        assert len(queue) == 0 and queue.chunks() == []
    finally:
        frontier.CHUNK, frontier.SPILL = saved


def test_popping_an_empty_frontier_is_an_index_error() -> None:
    queue: Frontier[int] = Frontier()
    with pytest.raises(IndexError, match="empty frontier"):
        queue.popleft()
    queue.append(1)
    assert queue.popleft() == 1
    with pytest.raises(IndexError):
        queue.popleft()
