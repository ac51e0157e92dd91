"""Every speed figure of kvoracle in one table: the model checker (distinct states per
second, bytes per stored state, the peak memory of its largest process; one search in
one process, then split across processes and across a local Ray cluster; interpreted, and
compiled by mypyc where a C compiler is found), each stateful machine with its audit after every step and
after every 10th, its programs drawn by Hypothesis and by the random generator (steps per second), Hypothesis alone on the cache machine's rules and on two bare rules, the reference's bookkeeping per request next to
each installed engine's, the speed-up of a campaign on two worker processes, and
bench/gpu_check.py's swap and audit figures where torch or cupy finds a CUDA device. A
benchmark, not a test: no asserts, and each figure is measured here and now, side by
side in one run; its last row says how many cores other processes kept busy just before
each part began, so a figure measured beside other work is seen as such.

    python bench/summary.py [--quick] [--scopes ci readmission deep] [--max-states N] [--partitions N ...]
                            [--parts model-checker machines bookkeeping workers gpu]

`make bench` runs it (7 to 31 minutes on 2 cores here, with the machine's speed that day). The re-admission and
deep scopes take minutes a row (the deep one, 210,358 states: about 3 minutes interpreted in one process, 37 s
compiled on 2); a scope cut short by --max-states says so in its row.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import engine_speed  # noqa: E402  (bench/ is on sys.path when run as a script)
import gpu_check  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, rule  # noqa: E402

from kvoracle.oracle import audit, isolation, stateful  # noqa: E402
from kvoracle.oracle.cache_machine import CacheMachine, Tally  # noqa: E402
from kvoracle.oracle import campaign  # noqa: E402
from kvoracle.oracle.campaign import run_seeds  # noqa: E402
from kvoracle.oracle.cli import main as kvoracle  # noqa: E402
from kvoracle.oracle.cli import run_target  # noqa: E402
from kvoracle.oracle.engine_campaign import run_engine  # noqa: E402
from kvoracle.oracle.engines import adapter_class  # noqa: E402
from kvoracle.oracle.report import columns  # noqa: E402
from kvoracle.oracle.targets import all_targets  # noqa: E402
from kvoracle.proofs import compiled  # noqa: E402
from kvoracle.proofs.model_check import Report, explore  # noqa: E402
from kvoracle.proofs.partitioned import explore_partitioned  # noqa: E402
from kvoracle.proofs.obligations import CI_SCOPE, DEEP_SCOPE  # noqa: E402
from kvoracle.spec.next import Scope  # noqa: E402
from kvoracle.spec.actions import CacheEvent, apply_cache  # noqa: E402
from kvoracle.spec.state import CacheState  # noqa: E402

# Issue 17's re-admission scope: storage on, three requests, each admitted up to twice.
READMISSION_SCOPE = Scope(gpu_blocks=6, cpu_blocks=2, storage=True, requests=3, prompt_blocks=2, alphabet=2,
                          admissions=2)
SCOPES = {"ci": CI_SCOPE, "readmission": READMISSION_SCOPE, "deep": DEEP_SCOPE}
Row = tuple[str, str, str]  # what, figure, how it was measured


def model_check(names: Sequence[str], max_states: int, partitions: Sequence[int], ray: bool) -> list[Row]:
    """Each scope's search in one process, then split across each count of `partitions`
    (processes of this machine), and across 2 actors of a local Ray cluster (`ray`); each
    but the last also compiled by mypyc, where it builds (proofs/compiled.py)."""
    rows = []
    try:
        compiled.build(lambda msg: print(f"... {msg}", file=sys.stderr, flush=True))
        compiled_too = True
    except compiled.CompileError as e:
        rows.append(("model check, compiled by mypyc", "-", str(e).splitlines()[0]))
        compiled_too = False
    for name in names:
        runs: list[tuple[str, Callable[[], Report]]] = [("", partial(explore, SCOPES[name], max_states=max_states))]
        if compiled_too:
            runs.append((", compiled by mypyc", partial(compiled.search, SCOPES[name], max_states=max_states)))
        runs += [(f", {n} partitions", partial(explore_partitioned, SCOPES[name], max_states=max_states,
                                               partitions=n)) for n in partitions]
        if compiled_too:
            runs += [(f", {n} partitions, compiled by mypyc", partial(
                compiled.search, SCOPES[name], max_states=max_states, partitions=n)) for n in partitions]
        if ray:
            runs.append((", 2 partitions on a local Ray cluster", partial(
                explore_partitioned, SCOPES[name], max_states=max_states, partitions=2, ray="local")))
        for how, run in runs:
            r, peak = in_child(run)
            done = "" if r.complete else f", cut at {max_states:,} states"
            rows.append((f"model check, {name} scope{how}", f"{r.rate:,.0f} states/s",
                         f"{r.states:,} states, {r.transitions:,} transitions in {r.seconds:.1f} s, "
                         f"{r.bytes_per_state:,.0f} bytes/state stored, peak {peak / 2**20:,.0f} MB "
                         f"in the largest process ({peak / r.states:,.0f} bytes/state){done}"))
    return rows


def in_child(run: Callable[[], Report]) -> tuple[Report, int]:
    """run() in a forked process: its report, and the peak resident bytes of the largest
    process the search used (that process, or one of its workers)."""
    def measured() -> tuple[Report, int]:
        report = run()
        peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return report, peak * 1024  # ru_maxrss is in KiB on Linux

    answer = isolation.in_child(measured)
    if isinstance(answer, isolation.Ended):
        raise RuntimeError(f"the search's process {answer}")
    return answer


class Unchecked(CacheMachine):
    """The cache machine with its audit and refinement off. It still keeps its record of
    spec's state (its rules read it: which requests are live, which are ready) and checks
    LIVE-EXIT and what `ready` reports, which cost little."""

    tally = Tally()

    def _check(self, name: str) -> CacheState | None:
        return None

    def _refine(self, name: str, event: CacheEvent, got: CacheState | None) -> None:
        assert self.model is not None
        self.model = apply_cache(self.model, event)  # the record alone: nothing compared


def rules_alone(machine: type[RuleBasedStateMachine]) -> tuple[type[RuleBasedStateMachine], Tally]:
    """A machine with `machine`'s rules and their argument strategies, whose bodies only
    count their calls (oracle.stateful reads the rules)."""
    tally = Tally()
    body: dict[str, object] = {"tally": tally}
    for name, found in stateful.rules(machine).items():
        def count(self: RuleBasedStateMachine, **_: object) -> None:
            tally.steps += 1
        as_rule: Callable[..., Callable[[Callable[..., None]], object]] = rule  # with the strategies of `found`
        body[name] = as_rule(**found.arguments)(count)
    return type(f"{machine.__name__}RulesAlone", (RuleBasedStateMachine,), body), tally


def bare_machine() -> tuple[type[RuleBasedStateMachine], Tally]:
    """The cheapest machine Hypothesis runs: two rules, no arguments, bodies that count."""
    tally = Tally()

    def count(self: RuleBasedStateMachine) -> None:
        tally.steps += 1

    return type("Bare", (RuleBasedStateMachine,), {"first": rule()(count), "second": rule()(count)}), tally


def hypothesis_alone(what: str, machine: type[RuleBasedStateMachine], tally: Tally, examples: int, how: str) -> Row:
    """A machine whose bodies only count their calls: the row of its steps per second."""
    start = time.perf_counter()
    run_seeds(machine, [0], examples=examples, steps=100)
    seconds, steps = time.perf_counter() - start, tally.steps
    return what, f"{steps / seconds:,.0f} steps/s", f"{steps:,} steps in {seconds:.1f} s: {how}"


def machines(examples: int) -> list[Row]:
    """Each machine (the engine machine on the reference adapter, with valid input and with
    bad), its programs drawn by Hypothesis and by the random generator, with its audit after
    every step, then after every 10th; the cache
    machine with its audit and refinement off (what Hypothesis, the engine and its record
    cost); its rules with empty bodies, and two bare rules (what Hypothesis alone costs)."""
    rows = []
    adapter = adapter_class("reference")
    for generator, every in (("hypothesis", 1), ("hypothesis", 10), ("random", 1), ("random", 10)):
        audit.set_interval(every)
        campaign.set_generator(generator)
        drawn = f"{'' if generator == 'hypothesis' else ', random generator'}, audit every {every}"
        for target in (t for t in all_targets() if t.mutant is None):
            row = run_target(target, [0], examples, 100)
            rows.append((f"{target.level} machine ({target.name}){drawn}",
                         f"{row.steps / row.seconds:,.0f} steps/s",
                         f"{row.steps:,} steps in {row.seconds:.1f} s, seed 0, {row.verdict}"))
        for bad in (False, True):
            e = run_engine(adapter, bad, [0], examples, 100, Path("out/repro"))
            label = f"engine machine (reference adapter{', bad input' if bad else ''}){drawn}"
            rows.append((label, f"{e.tally.steps / e.seconds:,.0f} steps/s",
                         f"{e.tally.steps:,} steps in {e.seconds:.1f} s, seed 0, {e.verdict}"))
    audit.set_interval(1)
    campaign.set_generator("hypothesis")  # the rows below measure Hypothesis's share
    start = time.perf_counter()
    unchecked = run_seeds(Unchecked, [0], examples=examples, steps=100)
    seconds, steps = time.perf_counter() - start, Unchecked.tally.steps
    verdict = "pass" if unchecked.passed else f"VIOLATION ({unchecked.first_id}): the figure is not comparable"
    rows.append(("cache machine, no audit, no refinement", f"{steps / seconds:,.0f} steps/s",
                 f"{steps:,} steps in {seconds:.1f} s, seed 0, {verdict}: what Hypothesis, the engine and the "
                 "machine's record cost"))
    rows.append(hypothesis_alone("cache machine's rules alone", *rules_alone(CacheMachine), examples,
                                 "Hypothesis drawing the same rules and arguments for bodies that do nothing (no "
                                 "engine, no preconditions): the ceiling of any machine built on it"))
    rows.append(hypothesis_alone("two rules without arguments", *bare_machine(), examples,
                                 "what Hypothesis alone costs per step, drawing only which rule comes next"))
    campaign.set_generator(campaign.DEFAULT_GENERATOR)
    return rows


def bookkeeping(requests: int) -> list[Row]:
    a = argparse.Namespace(requests=requests, live=32, blocks=1024, seed=0, repeat=engine_speed.REPEAT)
    results = engine_speed.measure_engines(list(engine_speed.DRIVERS), a)
    base = results["reference"]
    rows = []
    for name, r in results.items():
        if isinstance(r, str):
            rows.append((f"bookkeeping, {name}", "-", r))
            continue
        total = engine_speed.total(r)
        ratio = total / engine_speed.total(base) if isinstance(base, dict) else float("nan")
        rows.append((f"bookkeeping, {name}", f"{total:,.0f} µs/request",
                     f"{ratio:.2f}x the reference; match {r['match']:.0f}, allocate {r['allocate']:.0f}, "
                     f"free {r['free']:.0f} µs; {requests:,} requests, 1,024 blocks of 16 tokens, the fastest of {a.repeat} runs, taking turns"))
    return rows


def workers(examples: int) -> list[Row]:
    """The cache level's campaign (reference and mutants) on 1 process, on 2, and on a
    local Ray cluster (when Ray is installed; its start-up included)."""
    runs = {"1 process": ["--workers", "1"], "2 processes": ["--workers", "2"]}
    if importlib.util.find_spec("ray") is not None:
        runs["a local Ray cluster"] = ["--ray", "local"]
    seconds, failed = {}, {}
    for where, flags in runs.items():
        start = time.perf_counter()
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = kvoracle(["check", "--level", "cache", "--seeds", "1", "--examples", str(examples),
                             "--no-coverage", *flags])
        seconds[where] = time.perf_counter() - start
        if code != 0:  # a run that failed fast is no speed-up
            failed[where] = (err.getvalue().strip().splitlines() or [f"exit {code}"])[-1]
    one = seconds.pop("1 process")
    return [(f"kvoracle check on {where}", "-", f"failed: {failed[where]}") if where in failed else
            (f"kvoracle check on {where}", f"{one / s:.2f}x",
             f"cache level, 1 seed of {examples}: {one:.1f} s on 1 process, {s:.1f} s on {where}")
            for where, s in seconds.items()]


def gpu() -> list[Row]:
    """bench/gpu_check.py's figures (swaps, the whole-pool audit, their hardware references)
    for torch and cupy, where either finds a CUDA device; its lines go to stderr."""
    looked = {b: gpu_check.find_device(b) for b in ("torch", "cupy")}
    found = [(b, d) for b, (d, _) in looked.items() if d is not None]
    if not found:
        why = "; ".join(f"{b}: {reason}" for b, (_, reason) in looked.items())
        return [("GPU block pool", "-", f"no CUDA device found ({why}): run bench/gpu_check.py on a GPU machine "
                 "(docs/gpu.md has an H200's figures)")]
    rows: list[Row] = []
    hbm = 0.0
    with contextlib.redirect_stdout(sys.stderr):
        for backend, device in found:
            hbm, more = gpu_check.figures(backend, device, 40.0, hbm)
            rows += more
    return rows


PARTS = ["model-checker", "machines", "bookkeeping", "workers", "gpu"]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller runs (a minute): the CI scope only")
    p.add_argument("--scopes", nargs="+", choices=list(SCOPES), default=["ci"],
                   help="model-check scopes to explore (default: ci)")
    p.add_argument("--max-states", type=int, default=2_000_000, help="cut a scope's search after N states")
    p.add_argument("--partitions", type=int, nargs="*", default=[2], metavar="N",
                   help="also split each scope's search across N processes (default: 2; none: no split search, "
                        "neither on processes nor on a local Ray cluster)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS,
                   help="which figures to measure (default: all)")
    a = p.parse_args(argv)
    random.seed(0)
    examples = 40 if a.quick else 300
    parts: dict[str, Callable[[], list[Row]]] = {
        "model-checker": lambda: model_check(a.scopes, a.max_states, a.partitions, bool(a.partitions) and not a.quick
                                             and importlib.util.find_spec("ray") is not None),
        "machines": lambda: machines(examples),
        "bookkeeping": lambda: bookkeeping(500 if a.quick else 2000),
        "workers": lambda: workers(examples),
        "gpu": gpu,
    }
    rows: list[Row] = []
    busy: list[str] = []
    for part, run in parts.items():
        if part not in a.parts:
            continue
        before = busy_cores()
        busy += [] if before is None else [f"{part} {before:.1f}"]
        print(f"measuring: {part} ...", file=sys.stderr, flush=True)
        rows += run()
    if busy:
        rows.append(("cores busy before each part", ", ".join(busy),
                     f"of {os.cpu_count()}, in the second before the part began (this process idle): work of other "
                     "processes; figures measured beside it are not comparable with a quiet run's"))
    print(columns(("measure", "figure", "how"), rows))


def busy_cores(seconds: float = 1.0) -> float | None:
    """How many cores the machine's other processes kept busy over `seconds` (from
    /proc/stat; None where there is none)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle and iowait
        return sum(fields) - idle, sum(fields)
    try:
        busy0, total0 = sample()
        time.sleep(seconds)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


if __name__ == "__main__":
    main()
