"""Every proof obligation of kvoracle, each tied to the property IDs it shows.

`kvoracle prove` runs them and prints one row per (property, method): the bounded
model check of spec/, the Hypothesis machines on the reference, and the CrossHair
contracts. Each method explores every case within its stated scope only.
"""

from __future__ import annotations

import time
from functools import partial
from collections.abc import Callable
from dataclasses import dataclass

from kvoracle.oracle.workers import in_order
from kvoracle.proofs import compiled
from kvoracle.proofs.model_check import MUTATIONS, NOT_MODELLED, POLICY, Report, explore
from kvoracle.proofs.partitioned import explore_partitioned
from kvoracle.spec.next import Scope
from kvoracle.spec.properties import PROPERTIES

MODEL_IDS = tuple(i for i in PROPERTIES if i not in NOT_MODELLED + POLICY)
CACHE_MACHINE_IDS = ("INV-CONSERVE", "INV-REFCOUNT", "INV-TREE", "INV-TIER", "INV-NO-UAF", "INV-PIN",
                     "INV-HEAP-SOUND", "INV-HEAP-COMPLETE", "INV-COUNTERS", "INV-REQUEST", "LIVE-EXIT", "LIVE-EVICT",
                     "LIVE-DRAIN")
SCHEDULER_MACHINE_IDS = ("INV-CONSERVE", "INV-REFCOUNT", "INV-TREE", "INV-TIER", "INV-NO-UAF", "INV-PIN",
                         "INV-HEAP-SOUND", "INV-HEAP-COMPLETE", "INV-COUNTERS", "INV-REQUEST", "INV-CONTENT",
                         "LIVE-EXIT", "LIVE-TRANSFER", "LIVE-ADMIT", "LIVE-PROGRESS", "LIVE-DRAIN")
ALL_IDS = tuple(PROPERTIES)
# Storage and re-admission after preemption together (the scope the reference's exit paths need).
CI_SCOPE = Scope(gpu_blocks=6, cpu_blocks=2, storage=True, requests=2, prompt_blocks=2, alphabet=2, admissions=2)
# Prefill in chunks of any size, and a decoded token that grows the table.
CHUNKED_SCOPE = Scope(gpu_blocks=4, cpu_blocks=1, storage=True, requests=2, prompt_blocks=2, alphabet=2,
                      admissions=1, decode=1, chunked=True)
MUTANT_SCOPE = Scope(gpu_blocks=6, cpu_blocks=2, storage=True, requests=2, prompt_blocks=2, alphabet=2, admissions=2)
DEEP_SCOPE = Scope(gpu_blocks=8, cpu_blocks=3, storage=True, requests=4, prompt_blocks=2, alphabet=2, admissions=1)
QUICK_SCOPE = Scope(gpu_blocks=4, cpu_blocks=1, storage=True, requests=2, prompt_blocks=2, alphabet=2, admissions=1)
# name -> (model-check scope, its state limit, machine programs per 100 asked)
SCOPES: dict[str, tuple[Scope, int, int]] = {
    "quick": (QUICK_SCOPE, 100_000, 20),
    "ci": (CI_SCOPE, 500_000, 100),
    "deep": (DEEP_SCOPE, 5_000_000, 500),
}


@dataclass(frozen=True)
class Row:
    property_id: str
    method: str
    scope: str
    explored: str
    seconds: float
    verdict: str  # "holds", "found (expected)", "no counterexample", or a failure
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Search:
    """Where each model check's search runs: in one process (partitions 1), or split
    across `partitions` workers, processes here or Ray actors on the cluster at `ray`;
    `compiled`: compiled by mypyc, in a child process here (proofs/compiled.py)."""

    partitions: int = 1
    ray: str | None = None
    compiled: bool = False

    def describe(self) -> str:
        """How the search ran, as the end of its row ('' in one interpreted process)."""
        where = f", {self.partitions} partitions" if self.partitions > 1 else ""
        where += " on Ray" if where and self.ray else ""
        return where + (", compiled" if self.compiled else "")

    def run(self, scope: Scope, mutation: str = "", max_states: int = 2_000_000,
            progress: Callable[[int, int], None] | None = None) -> Report:
        if self.compiled:
            return compiled.search(scope, mutation, max_states, self.partitions, progress)
        if self.partitions > 1:
            return explore_partitioned(scope, mutation, max_states, self.partitions, self.ray, progress)
        return explore(scope, mutation, max_states, progress)


def model_rows(scope: Scope, max_states: int, search: Search = Search(),
               progress: Callable[[int, int], None] | None = None) -> list[Row]:
    r = search.run(scope, max_states=max_states, progress=progress)
    explored = (f"{r.states:,} states, {r.transitions:,} transitions, drain <= {r.longest_drain}, "
                f"{r.bytes_per_state:.0f} B/state{search.describe()}")
    if r.passed:
        return [Row(i, "model check", scope.describe(), explored, r.seconds, "holds", True) for i in MODEL_IDS]
    why = f"state limit ({max_states:,}) reached" if not r.complete else counterexample(r)
    failed = {v.id for v in r.violation} or set(MODEL_IDS)
    return [Row(i, "model check", scope.describe(), explored, r.seconds,
                "VIOLATED" if i in failed else "not reached", False, why) for i in MODEL_IDS]


def mutant_rows(scope: Scope, search: Search = Search()) -> list[Row]:
    """The FastDeploy bugs' mutated specifications must be refuted, with a short trace."""
    out = []
    for name in MUTATIONS:
        r = search.run(scope, name)
        found = bool(r.violation)
        out.append(Row(r.violation[0].id if found else "-", f"model check of mutant {name}", scope.describe(),
                       f"{r.states:,} states{search.describe()}", r.seconds,
                       f"found in {len(r.trace)} steps" if found else "MISSED", found,
                       f"{name} -> {counterexample(r)}" if found else ""))
    return out


def counterexample(r: Report) -> str:
    """A search's first violation, then the steps of its trace, numbered."""
    return "\n".join([str(r.violation[0]), *(f"  {i}. {step}" for i, step in enumerate(r.trace, 1))])


def machine_rows(examples: int) -> list[Row]:
    from kvoracle.oracle.campaign import run_machine
    from kvoracle.oracle.targets import Target, tally_of

    out = []
    for level, ids in (("cache", CACHE_MACHINE_IDS), ("scheduler", SCHEDULER_MACHINE_IDS)):
        machine = Target("reference", level, None).machine()
        res = run_machine(machine, seed_value=0, examples=examples, steps=100)
        tally = tally_of(machine)
        scope = f"{level} machine, {examples} programs x <= 100 steps, seed 0"
        explored = f"{tally.steps:,} steps, {tally.faults:,} faults, {tally.bad_inputs:,} bad inputs"
        for i in ids:
            bad = res.violation is not None and i in {v.id for v in res.violation.violations}
            out.append(Row(i, "Hypothesis", scope, explored, res.seconds, "VIOLATED" if bad else
                           ("holds" if res.passed else "not reached"), res.passed))
    return out


def crosshair_rows(per_condition_timeout: float, total_timeout: float) -> list[Row]:
    from kvoracle.proofs.crosshair_check import check

    out = []
    for c in check(per_condition_timeout=per_condition_timeout, total_timeout=total_timeout):
        ok = c.verdict == "confirmed-none-found"
        for i in c.property_ids:
            out.append(Row(i, "CrossHair", f"{c.function}, {per_condition_timeout:g} s per condition",
                           "symbolic paths until timeout", c.seconds, "no counterexample" if ok else c.verdict.upper(),
                           ok, c.detail))
    return out


def uncovered(rows: list[Row]) -> list[str]:
    """IDs of the design that no passing obligation covers."""
    covered = {r.property_id for r in rows if r.ok and r.method in ("model check", "Hypothesis", "CrossHair")}
    return [i for i in ALL_IDS if i not in covered]


def run_all(scope_name: str = "ci", crosshair: bool = True, examples: int = 100,
            progress: Callable[[str], None] | None = None, workers: int = 1, ray: str | None = None,
            partitions: int = 1, compiled_search: bool = False) -> list[Row]:
    """Every obligation at the named scope (SCOPES: quick, ci, deep), each group on one of
    `workers` processes (or on the Ray cluster at `ray`); the rows come back in the same
    order wherever they ran. partitions > 1: the groups run one after another, and each
    model check's search is split across that many workers (on the cluster at `ray`).
    compiled_search: the model checks run compiled by mypyc (built first, if need be)."""
    say = progress or (lambda _: None)
    start = time.perf_counter()
    scope, max_states, per_100 = SCOPES[scope_name]
    if compiled_search:
        if ray is not None:
            raise ValueError("the compiled search runs on this machine's processes, not on a Ray cluster")
        compiled.build(say)
    search = Search(partitions, ray, compiled_search)
    if partitions > 1:
        workers, ray = 1, None
    groups: list[tuple[str, Callable[[], list[Row]]]] = [
        (f"model check: {scope.describe()}", partial(model_rows, scope, max_states, search)),
        (f"model check: {CHUNKED_SCOPE.describe()}", partial(model_rows, CHUNKED_SCOPE, max_states, search)),
        ("model check of the FastDeploy-bug mutants", partial(mutant_rows, MUTANT_SCOPE, search)),
        ("Hypothesis machines on the reference", partial(machine_rows, max(1, examples * per_100 // 100))),
    ]
    if crosshair:
        groups.append(("CrossHair contracts", partial(crosshair_rows, 10.0, 600.0)))
    rows: list[Row] = []
    if workers <= 1 and ray is None:
        for what, run in groups:
            say(what)
            rows += run()
    else:
        say(f"{len(groups)} groups of obligations on " + (f"the Ray cluster at {ray}" if ray else f"{workers} processes"))
        for part in in_order(_run, [run for _, run in groups], workers, ray):
            rows += part
    say(f"done in {time.perf_counter() - start:.0f} s")
    return rows


def _run(group: Callable[[], list[Row]]) -> list[Row]:
    return group()
