"""Deleting steps from a failing program while it still fails: the one deletion loop of
the random generator's shrinker, of the pass after Hypothesis's shrinker (which now and
then leaves steps that do nothing), and of the shrinking of a program that ended its
campaign's process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Step = TypeVar("Step")

SHORT = 32  # a program this short tries deleting each run of steps at every offset


def delete_runs(program: list[Step], fails: Callable[[list[Step]], bool], short: int = SHORT) -> list[Step]:
    """`program` with runs of steps deleted for as long as it still `fails`: runs of half
    its length first, then of half that, down to single steps. A program no longer than
    `short` tries each run at every offset (about a replay per step at each length); a
    longer one, or any with `short` 0 (a costly replay), at offsets a run's length apart
    (about two replays per step in all)."""
    size = max(1, len(program) // 2)
    while size >= 1:
        i = 0
        while i + size <= len(program):
            trial = program[:i] + program[i + size:]
            if fails(trial):
                program = trial
            else:
                i += 1 if len(program) <= short else size
        size //= 2
    return program
