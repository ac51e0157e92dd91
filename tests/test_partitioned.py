"""The model check with its search split across workers (proofs.partitioned): the same
states, transitions and longest drain as the single search; every mutated specification
refuted with the same ID and a trace as short; the same on a local Ray cluster, whose
workers are separate interpreters; a state key that does not depend on the process; and
a worker that dies reported as such."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import pytest

from kvoracle.oracle.workers import Team
from kvoracle.proofs.model_check import MUTATIONS, Report, explore
from kvoracle.proofs.obligations import MUTANT_SCOPE, QUICK_SCOPE
from kvoracle.proofs.partitioned import explore_partitioned
from kvoracle.spec.next import Scope

ray_installed = importlib.util.find_spec("ray") is not None


@functools.cache
def single(scope: Scope) -> Report:
    """The single search of a scope, run once for every test that compares with it."""
    return explore(scope)


@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_a_split_search_visits_exactly_the_states_of_the_single_search(partitions: int) -> None:
    one = single(QUICK_SCOPE)  # swap, storage, preemption and faults: 593 states, 3,089 transitions
    split = explore_partitioned(QUICK_SCOPE, partitions=partitions)
    assert one.passed and split.passed
    assert (split.states, split.transitions, split.longest_drain) == (one.states, one.transitions, one.longest_drain)


@pytest.mark.parametrize("mutant", sorted(MUTATIONS))
def test_a_split_search_refutes_each_mutation_with_a_shortest_trace(mutant: str) -> None:
    one = explore(MUTANT_SCOPE, mutant)
    split = explore_partitioned(MUTANT_SCOPE, mutant, partitions=2)
    assert split.violation and split.violation[0].id == one.violation[0].id
    assert len(split.trace) == len(one.trace)  # both breadth first: the shortest length is unique
    assert split.trace[-1].split("(")[0] == one.trace[-1].split("(")[0]  # the same kind of violating step


def test_a_state_limit_cuts_a_split_search_short() -> None:
    r = explore_partitioned(QUICK_SCOPE, max_states=100, partitions=2)
    assert not r.complete and not r.passed and r.states > 100


def test_a_bad_partition_count_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 partition"):
        explore_partitioned(QUICK_SCOPE, partitions=0)


KEYS = """
from kvoracle.proofs.model_check import digest, relabel
from kvoracle.spec.next import Next, Scope, init
scope = Scope(gpu_blocks=4, cpu_blocks=1, storage=True, requests=2, prompt_blocks=2, alphabet=2, admissions=2)
level, keys = [relabel(init(scope))], set()
for _ in range(4):
    level = [relabel(n) for s in level for _, n in Next(scope).steps(s)]
    keys |= {digest(s) for s in level}
print(sorted(keys))
"""


def test_a_state_key_is_the_same_in_every_interpreter() -> None:
    """Workers on a cluster are separate interpreters, not forks: a key must not depend on
    an address (None's hash is one before Python 3.12; the first levels hold root nodes,
    whose parent is None, and transfers whose request has gone)."""
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    runs = [subprocess.run([sys.executable, "-c", KEYS], env=env, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) > 100


@pytest.mark.skipif(not ray_installed, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_a_search_split_across_a_local_ray_cluster_is_the_single_search() -> None:
    one = single(QUICK_SCOPE)
    on_ray = explore_partitioned(QUICK_SCOPE, partitions=2, ray="local")
    assert (on_ray.states, on_ray.transitions, on_ray.longest_drain, on_ray.passed) == (
        one.states, one.transitions, one.longest_drain, True)
    bug = explore_partitioned(MUTANT_SCOPE, "heap-drop", partitions=2, ray="local")
    assert bug.violation[0].id == "INV-HEAP-SOUND" and len(bug.trace) == len(explore(MUTANT_SCOPE, "heap-drop").trace)


def test_prove_splits_its_model_checks_and_refuses_partitions_with_workers() -> None:
    prove = [sys.executable, "-m", "kvoracle.oracle.cli", "prove", "--scope", "quick", "--no-crosshair"]
    done = subprocess.run([*prove, "--partitions", "2"], capture_output=True, text=True)
    assert done.returncode == 0 and "60 of 60 obligations hold" in done.stdout, done.stderr[-2000:]
    assert max(map(len, done.stdout.splitlines())) <= 120, done.stdout  # a paragraph per run, not a row per ID
    refused = subprocess.run([*prove, "--partitions", "2", "--workers", "2"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--partitions" in refused.stderr


def test_prove_prints_each_run_once_with_the_ids_under_each_verdict() -> None:
    from kvoracle.oracle.cli import obligation_runs
    from kvoracle.proofs.obligations import Row

    run = ("model check", "G6 C2 S R2x2/2 A2", "9 states", 0.25)
    rows = [Row("INV-PIN", *run, "VIOLATED", False, "trace"), Row("INV-TREE", *run, "not reached", False, "trace"),
            Row("INV-TIER", *run, "not reached", False, "trace"),
            Row("INV-CONTENT", "Hypothesis", "scheduler machine", "5 steps", 1.0, "holds", True)]
    assert obligation_runs(rows).splitlines() == [
        "model check, G6 C2 S R2x2/2 A2: 9 states; 0.2 s", "  VIOLATED: INV-PIN", "  not reached: INV-TREE INV-TIER",
        "  detail of INV-PIN INV-TREE INV-TIER:", "    trace",
        "Hypothesis, scheduler machine: 5 steps; 1.0 s", "  holds: INV-CONTENT"]
    rows[-1] = Row("INV-CONTENT", "Hypothesis", "scheduler machine", "5 steps", 1.0, "holds", True, "20 programs")
    assert obligation_runs(rows).splitlines()[-1] == "  holds: INV-CONTENT"  # a holding run's detail: only with --show
    assert obligation_runs(rows, show=True).splitlines()[-2:] == ["  detail of INV-CONTENT:", "    20 programs"]


class Dies:
    def __init__(self) -> None:
        pass

    def work(self) -> None:
        os._exit(3)  # as the kernel's OOM killer would end it: no exception, no answer


def test_a_worker_that_dies_is_reported_and_the_team_still_closes() -> None:
    with pytest.raises(RuntimeError, match="a worker died in work"):
        with Team(Dies, [(), ()]) as team:
            team.call("work", [(), ()])
