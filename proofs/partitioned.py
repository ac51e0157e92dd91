"""The model check of proofs.model_check, with one search split across workers: state
space partitioned by state key (worker i owns the states whose key is i modulo the
number of workers), breadth first, level by level.

Each round, every worker visits the states of the current depth that it owns (spec's
properties on each, exactly as the single search does), keeps the successors it owns,
and sends each other successor to its owner once. The next round starts with each
worker taking in what was sent to it. The states, transitions and verdict are those of
the single search: every reachable state is visited once, by its owner. A violation
gives a shortest trace, rebuilt from parent links asked of each state's owner.

Workers run on this machine's processes, or as actors on a Ray cluster, whose
processes get the same PYTHONHASHSEED: a state's key is Python's hash of its canonical
form, which must be the same in every worker.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvoracle.oracle.workers import Team
from kvoracle.proofs.frontier import Frontier
from kvoracle.proofs.model_check import (
    Report,
    Names,
    stored_bytes_of,
    no_cycle_collection,
    digest,
    key_path,
    model_of,
    relabel,
    replay,
    visit,
)
from kvoracle.spec import liveness
from kvoracle.spec.invariants import Violation
from kvoracle.spec.next import Scope, init
from kvoracle.spec.state import System

Arrival = tuple[int, int, System]  # a state's key, its parent's key, the state


@dataclass
class Round:
    """What one worker's round gives back."""

    outbound: list[list[bytes]]  # per worker: the arrivals sent to it, in pickled chunks
    states: int  # states this worker owns and has visited or queued
    frontier: int  # of which still to visit (the next depth)
    transitions: int = 0
    longest: int = 0  # the longest drain from a state visited this round
    violation: list[Violation] = field(default_factory=list)
    key: int = 0  # the state whose visit found the violation
    last_step: str | None = None  # the violating step, for a step property


class Partition:
    """One worker's share of the search."""

    def __init__(self, index: int, count: int, scope: Scope, mutation: str) -> None:
        self.index, self.count = index, count
        self.model = model_of(scope, mutation)
        self.bound = liveness.drain_bound(scope.gpu_blocks, scope.cpu_blocks, scope.requests)
        self.parents: dict[int, int | None] = {}
        self.drains: dict[int, int] = {}
        self.sent: set[int] = set()  # keys already sent to their owner
        self.frontier: Frontier[tuple[int, System]] = Frontier()
        first = relabel(init(scope))
        root = digest(first)
        if root % count == index:
            self.parents[root] = None
            self.frontier.append((root, first))

    def round(self, arrivals: list[bytes]) -> Round:
        # Unpickling builds millions of containers: with the cycle collector on, it would
        # rescan the whole search's heap several times per batch (3-6x the unpickling).
        with no_cycle_collection():
            return self._round(arrivals)

    def _round(self, arrivals: list[bytes]) -> Round:
        for chunk in arrivals:
            for key, parent, s in pickle.loads(chunk):
                if key not in self.parents:
                    self.parents[key] = parent
                    self.frontier.append((key, s))
        todo, self.frontier = self.frontier, Frontier()
        outbound: list[Frontier[Arrival]] = [Frontier() for _ in range(self.count)]
        done = Round([], 0, 0)
        for key, s in todo.drain():
            v = visit(self.model, s, key, self.drains, self.bound)
            done.transitions += len(v.successors) + (v.last_step is not None)
            if v.violation:
                done.violation, done.key, done.last_step = v.violation, key, v.last_step
                break
            done.longest = max(done.longest, v.drained)
            for k, names, nxt in v.successors:
                self._route(k, key, nxt, names, outbound)
        done.outbound = [out.chunks() for out in outbound]
        done.states, done.frontier = len(self.parents), len(self.frontier)
        return done

    def stored_bytes(self) -> int:
        return stored_bytes_of(self.parents, self.drains)

    def _route(self, k: int, parent: int, nxt: System, names: tuple[Names, Names],
               outbound: list[Frontier[Arrival]]) -> None:
        owner = k % self.count
        if owner == self.index:
            if k not in self.parents:
                self.parents[k] = parent
                self.frontier.append((k, relabel(nxt, names)))
        elif k not in self.sent:
            self.sent.add(k)
            outbound[owner].append((k, parent, relabel(nxt, names)))

    def parent(self, key: int) -> int | None:
        return self.parents[key]

    def replay(self, path: list[int]) -> list[str]:
        return replay(self.model, path)


def explore_partitioned(scope: Scope, mutation: str = "", max_states: int = 2_000_000, partitions: int = 2,
                        ray: str | None = None, progress: Callable[[int, int], None] | None = None) -> Report:
    """proofs.model_check.explore, on `partitions` workers (processes of this machine, or
    Ray actors on the cluster at `ray`)."""
    if partitions < 1:
        raise ValueError(f"a search needs at least 1 partition, not {partitions}")
    start = time.perf_counter()
    args = [(i, partitions, scope, mutation) for i in range(partitions)]
    seed = os.environ.get("PYTHONHASHSEED", "0")
    with Team(Partition, args, ray, env={"PYTHONHASHSEED": seed}) as team:
        arrivals: list[list[bytes]] = [[] for _ in range(partitions)]
        transitions = longest = 0
        while True:
            rounds: list[Round] = team.call("round", [(a,) for a in arrivals])
            transitions += sum(r.transitions for r in rounds)
            longest = max([longest, *(r.longest for r in rounds)])
            states = sum(r.states for r in rounds)

            def report(found: list[Violation], trace: list[str], complete: bool = True) -> Report:
                stored = sum(team.call("stored_bytes", [()] * partitions))
                return Report(scope, mutation, states, transitions, time.perf_counter() - start, longest, found,
                              trace, complete, stored)

            found = [r for r in rounds if r.violation]
            if found:  # a state violation's trace is one step shorter than a step violation's
                first = min(found, key=lambda r: r.last_step is not None)
                path = key_path(lambda k: team.call_one(k % partitions, "parent", (k,)), first.key)
                to_state = team.call_one(0, "replay", (path,))  # keys are hashes of a worker's seed
                return report(first.violation, to_state if first.last_step is None else [*to_state, first.last_step])
            arrivals = [[chunk for r in rounds for chunk in r.outbound[i]] for i in range(partitions)]
            if progress is not None:
                progress(states, sum(r.frontier for r in rounds))
            if states > max_states:
                return report([], [], complete=False)
            if not any(r.frontier for r in rounds) and not any(arrivals):
                return report([], [])
