"""`kvoracle`: the command line. `kvoracle check` is the main job."""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import textwrap
import time
from contextlib import closing, nullcontext
from functools import partial
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO, cast

from kvoracle.kvcache.pool import BackendUnavailable, UnknownBackend, default_backend, make_pool
from kvoracle.oracle import campaign
from kvoracle.oracle.campaign import RunResult, counts, programs_per_seed, run_seeds, shown
from kvoracle.oracle.violations import Baseline
from kvoracle.oracle.engine import REQUEST_LEVEL, BadInput
from kvoracle.oracle.findings import NOT_SCRIPTED, scripted, standalone, write_reproduction
from kvoracle.oracle.engines import ENGINES
from kvoracle.oracle.mutants import MUTANTS
from kvoracle.oracle.reach import Tracker
from kvoracle.oracle.report import columns
from kvoracle.oracle import audit, stateful, watchdog
from kvoracle.oracle.arguments import at_least
from kvoracle.oracle.scheduler_machine import FAULT_RATE, use_faults
from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.isolation import Ended
from kvoracle.oracle.journal import read
from kvoracle.oracle.survival import ended_result, on_its_own, quiet
from kvoracle.oracle.unchecked import refusals_hint

from kvoracle.oracle.targets import Target, all_targets, tally_of
from kvoracle.oracle.workers import LOCAL, ClusterUnavailable, each_alone, session

if TYPE_CHECKING:  # the engine campaign's modules load when an engine is checked
    from kvoracle.oracle.engine_campaign import EngineRow
    from kvoracle.proofs.obligations import Row as ObligationRow

FAULT_RATE_DEFAULT = 0.3
REPRO_DIR = "out/repro"


@dataclass(frozen=True)
class Row:
    target: Target
    steps: int
    faults: int
    bad_inputs: int
    verdict: str
    first_id: str
    shrunk: int
    result: RunResult | None
    seconds: float
    outcomes: dict[str, int] = field(default_factory=dict)  # transfers ended, by outcome
    known: dict[str, int] = field(default_factory=dict)  # known violation -> programs that showed it

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "caught")


def run_target(target: Target, seeds: Sequence[int], examples: int, steps: int,
               baseline: Baseline | None = None) -> Row:
    """The target's campaign, in this process."""
    return target_row(target, *campaign_of(target, seeds, examples, steps, baseline))


def campaign_of(target: Target, seeds: Sequence[int], examples: int, steps: int, baseline: Baseline | None = None,
                journal: Path | None = None) -> tuple[RunResult, Tally, float]:
    """Its result, its machine's tally and its seconds (`journal`: the machine writes each
    program there, for the parent of a process the engine may end)."""
    machine = target.machine()
    use_target_faults(target)
    start = time.perf_counter()
    run = machine if journal is None else on_its_own(machine, journal, f"{target.name} ({target.level})")
    result = run_seeds(run, seeds, examples=programs_per_seed(target.level, examples), steps=steps,
                       baseline=baseline)
    return result, tally_of(machine), time.perf_counter() - start


def use_target_faults(target: Target) -> None:
    """Draw the faults the target's engine can suffer, in this process (its adapter's
    `fault_kinds`), as its campaign, a replay and a reproduction must."""
    use_faults(getattr(target.adapter, "fault_kinds", None))


def target_row(target: Target, result: RunResult, tally: Tally, seconds: float) -> Row:
    if target.mutant is None:
        verdict = "pass" if result.passed else "VIOLATION"  # as an engine campaign's row says it
    elif result.passed:
        verdict = "SURVIVED"
    else:
        verdict = "caught" if audit.catches(result.first_id, target.mutant.kills) else "WRONG-ID"
    return Row(
        target, tally.steps, tally.faults, tally.bad_inputs, verdict, result.first_id,
        len(result.counterexample), None if result.passed else result, seconds, dict(tally.outcomes), result.known,
    )


def progress(out: TextIO, done: int, total: int, label: str) -> None:
    """A bar redrawn in place on a terminal; elsewhere (a CI log) a plain line per tenth done."""
    if not out.isatty():
        if total and done and (done == total or 10 * done // total > 10 * (done - 1) // total):
            out.write(f"kvoracle: {done}/{total} done" + ("" if done == total else f"; now {label.strip()}") + "\n")
            out.flush()
        return
    width = 24
    filled = width * done // total if total else width
    out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<28}")
    out.flush()


def end_progress(out: TextIO) -> None:
    """The bar's line ended (a plain progress line ends itself)."""
    if out.isatty():
        out.write("\n")


def table(rows: Sequence[Row]) -> str:
    head = ("target", "level", "steps", "faults", "bad inputs", "verdict", "first violated", "shrunk", "time")
    body = [
        (r.target.name, r.target.level, *counts(r.result, r.steps, r.faults, r.bad_inputs), r.verdict,
         r.first_id or "-", str(r.shrunk) if r.result else "-", f"{r.seconds:.1f}s")
        for r in rows
    ]
    return columns(head, body)


def show(rows: Sequence[Row]) -> str:
    out = []
    for r in rows:
        if r.result is None or r.result.violation is None:
            continue
        out.append(f"\n{r.target.name}: {r.result.violation}")
        out += numbered(r.result)
    return "\n".join(out)


def numbered(result: RunResult) -> list[str]:
    """The program as numbered lines. Where the check fired after a call its last step
    made (grow's eviction: evict_gpu), that line says so: the header names the call."""
    steps = shown(result)
    lines = [f"  {i}. {step}" for i, step in enumerate(steps, 1)]
    call = result.violation.step if result.violation is not None else ""
    if call.split(":")[0] in ("drain", "teardown"):  # the machine's drain, after the program's last step
        lines.append(f"  then the drain at the end (the check fired there, after its {call.split(':')[-1]})"
                     if ":" in call else "  then the drain at the end (the check fired there)")
    # a step that names its call (grow, bad_input's DOUBLE_FREE) needs nothing; "the program": no call
    elif lines and call and call.isidentifier() and call.lower() not in steps[-1].lower():
        lines[-1] += f"   (the check fired after its call {call})"
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    if args.engine or args.adapter:
        return cmd_check_engine(args)
    problem = check_problem(args)
    if problem:
        print(f"kvoracle check: {problem}", file=sys.stderr)
        return 2
    if args.record:  # seconds, where the campaign takes minutes: the trace is there first
        if not record_trace(args.record, args.record_events, args.seed, args.record_level, args.mutant):
            return 2
        if args.record_only:
            return 0
    targets = all_targets()
    if args.mutant:
        level = next(t.level for t in targets if t.name == args.mutant)
        targets = [t for t in targets if t.name == args.mutant or (t.mutant is None and t.level == level)]
    if args.level != "all":
        targets = [t for t in targets if t.level == args.level]
    if args.reference_only:
        targets = [t for t in targets if t.mutant is None]
    settings = settings_option(args, pool=True)
    if settings is None:
        return 2
    seeds = list(range(args.seed, args.seed + args.seeds))
    tracker = coverage_tracker(args) if args.ray in (None, LOCAL) else None  # a remote node's paths are not ours
    jobs = [Job(t, seeds, args.examples, args.steps, tracker is not None and t.mutant is None, settings)
            for t in targets]
    rows = run_jobs(jobs, args.workers, tracker, args.ray)
    end_progress(sys.stderr)
    print(table(rows))
    if args.show:
        print(show(rows))
    if args.repro_dir:
        for row in rows:
            reproduce(row, Path(args.repro_dir))
    if args.json:
        write_json(args.json, rows)
    bad = [r for r in rows if not r.ok]
    reach = "" if tracker is None else "; " + report_reach(tracker, args.coverage_report)
    unexpected = ", ".join(f"{r.target.name} ({r.target.level}) {r.verdict}" for r in bad)
    shows = not args.show and any(r.result is not None and r.result.violation is not None for r in bad)
    print(f"\n{len(rows) - len(bad)} of {len(rows)} targets as expected"
          + ("" if not bad else f"; not as expected: {unexpected}") + reach
          + small_campaign_hint(args, bad) + broken_reference_hint(bad) + weak_checker_hint(bad, small(args))
          + ("\n(--show prints each counterexample as numbered steps)" if shows else ""))
    return 0 if not bad else 1


def check_problem(args: argparse.Namespace) -> str:
    """Why the reference-and-mutants campaign cannot run as asked ('' when it can): found
    before it runs, not after minutes of it."""
    for flag, given in (("--bad-input", args.bad_input), ("--expect", args.expect)):
        if given:
            return f"{flag} needs --engine or --adapter"
    levels = {m.name: m.level for m in MUTANTS}
    if args.mutant is not None and args.reference_only:
        return "--reference-only excludes --mutant"
    if args.mutant is not None and args.mutant not in levels:  # '' too: no mutant is named so
        near = difflib.get_close_matches(args.mutant.replace("_", "-"), levels, n=1)
        return (f"no mutant named {args.mutant!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                + f" (known: {', '.join(sorted(levels))})")
    level = levels.get(args.mutant or "")
    if level and args.level not in ("all", level):
        return f"{args.mutant} is a {level}-level mutant; use --level {level} (or leave --level out)"
    if args.record_only and not args.record:
        return "--record-only needs --record FILE"
    if level and args.record and args.record_level != level:
        return f"--record: {args.mutant} is a {level}-level mutant; use --record-level {level}"
    if args.coverage_report and (args.no_coverage or importlib.util.find_spec("coverage") is None):
        return ("--coverage-report excludes --no-coverage" if args.no_coverage
                else "--coverage-report needs coverage.py: pip install coverage")
    return output_problem(args, args.repro_dir)


def output_problem(args: argparse.Namespace, repro_dir: str | None) -> str:
    """The first output path given that cannot be written ('' when all can)."""
    paths = (("--repro-dir", repro_dir, True), ("--json", args.json, False), ("--record", args.record, False),
             ("--coverage-report", args.coverage_report, False))
    return next((why for option, path, is_dir in paths if path and (why := unwritable(option, path, is_dir))), "")


def unwritable(option: str, path: str, is_dir: bool) -> str:
    """Why `path` (a directory, or a file) cannot be written ('' when it can). Probed by
    writing a temporary file in its nearest existing directory: access() says yes to root
    on /proc, say. Nothing is created that stays."""
    target = Path(path).absolute()
    if target.exists() and target.is_dir() != is_dir:
        return f"{option} {path}: {'not a directory' if is_dir else 'is a directory'}"
    where = target if is_dir else target.parent
    while not where.exists():
        where = where.parent
    if not where.is_dir():
        return f"{option} {path}: {where} is a file, not a directory"
    try:
        tempfile.TemporaryFile(dir=where).close()
    except OSError as e:
        return f"{option} {path}: no file can be made in {where} ({e.strerror or e})"
    return ""


def small(args: argparse.Namespace) -> bool:
    """A campaign smaller than the default one, which every mutant is held to (tests/test_mutants.py)."""
    return bool(args.seeds < campaign.SEEDS or args.examples < campaign.EXAMPLES or args.steps < campaign.STEPS)


def small_campaign_hint(args: argparse.Namespace, bad: Sequence[Row]) -> str:
    """Why a mutant may survive: a campaign too small to reach its bug."""
    if not small(args) or not any(r.verdict == "SURVIVED" for r in bad):
        return ""
    return (f"\n(a campaign smaller than the default --seeds {campaign.SEEDS} --examples {campaign.EXAMPLES} "
            f"--steps {campaign.STEPS} may not reach a mutant's bug)")


def broken_reference_hint(bad: Sequence[Row]) -> str:
    """Why a mutant's verdict may be WRONG-ID or a kill may come too soon: the reference
    it is built on violates a property itself."""
    broken = sorted(failing_reference_levels(bad))
    if not broken:
        return ""
    return (f"\n(the reference fails at the {' and '.join(broken)} level: each mutant of that level is the "
            "reference with one change, so its row is judged on a broken base; mend the reference first)")


def failing_reference_levels(bad: Sequence[Row]) -> set[str]:
    """The levels whose reference row is among the rows not as expected."""
    return {r.target.level for r in bad if r.target.mutant is None}


def weak_checker_hint(bad: Sequence[Row], small: bool = False) -> str:
    """What a mutant's bad verdict says where the reference of its level passed: the
    checks, not the reference, fell short of the catalogue (a SURVIVED of a `small`
    campaign may be the campaign's: small_campaign_hint says so instead)."""
    broken = failing_reference_levels(bad)
    verdicts = {r.verdict for r in bad if r.target.mutant is not None and r.target.level not in broken}
    if small:
        verdicts.discard("SURVIVED")
    said = {"SURVIVED": "SURVIVED: the campaign ran that mutant and no check failed, so the checks are weaker than "
                        "its bug (did spec/, a machine or the audit change?)",
            "WRONG-ID": "WRONG-ID: caught, but first by a property its catalogue entry (oracle/mutants.py) does not "
                        "name"}
    return "".join(f"\n({said[v]})" for v in ("SURVIVED", "WRONG-ID") if v in verdicts)


@dataclass(frozen=True)
class Settings:
    """The campaign's process-wide options: the process that parses them sets them, and so
    does every worker before its job (a Ray worker is a fresh process)."""

    fault_rate: float = FAULT_RATE_DEFAULT
    kv_backend: str = ""  # "": KV_BACKEND from the environment
    audit_every: int = 1
    step_timeout: float = watchdog.LIMIT[0]
    generator: str = campaign.DEFAULT_GENERATOR

    def check(self) -> None:
        """ValueError when one is out of range."""
        if not 0 <= self.fault_rate <= 1:
            raise ValueError(f"--fault-rate must be in [0, 1], got {self.fault_rate}")
        try:
            audit.check_interval(self.audit_every)
        except ValueError as e:
            raise ValueError(f"--audit-every: {e}") from None
        try:
            watchdog.check_limit(self.step_timeout)
        except ValueError as e:
            raise ValueError(f"--step-timeout: {e}") from None
        if self.generator not in campaign.GENERATORS:
            raise ValueError(f"--generator must be one of {', '.join(campaign.GENERATORS)}, got {self.generator!r}")

    def apply(self) -> None:
        """Set them in this process; ValueError, with nothing set, when one is out of range."""
        self.check()
        audit.set_interval(self.audit_every)
        watchdog.set_limit(self.step_timeout)
        campaign.set_generator(self.generator)
        FAULT_RATE[0] = self.fault_rate
        if self.kv_backend:
            os.environ["KV_BACKEND"] = self.kv_backend


@dataclass(frozen=True)
class Job:
    target: Target
    seeds: list[int]
    examples: int
    steps: int
    measured: bool  # under coverage (the reference rows)
    settings: Settings = Settings()
    baseline: Baseline | None = None
    journal: str = ""  # where its machine writes each program ('': nowhere)


@dataclass(frozen=True)
class Done:
    """What a job's process sends back: plain data (the target, an adapter loaded from a
    file say, stays with the parent)."""

    result: RunResult
    tally: Tally
    seconds: float
    arcs: dict[str, set[tuple[int, int]]]


def run_job(job: Job) -> Done:
    """One target's campaign, and the branches it took when measured (coverage comes
    back as data, merged by the parent)."""
    job.settings.apply()
    run = partial(campaign_of, job.target, job.seeds, job.examples, job.steps, job.baseline,
                  Path(job.journal) if job.journal else None)
    tracker = Tracker() if job.measured else None
    result, tally, seconds = run() if tracker is None else tracker.measured(run)
    return Done(result, tally, seconds, {} if tracker is None else tracker.arcs())


def run_jobs(jobs: Sequence[Job], workers: int, tracker: Tracker | None, ray: str | None = None) -> list[Row]:
    """Every job, in order, each in a process of its own, at most `workers` at once (or
    on the Ray cluster at `ray`). Each target runs the same seeds wherever it runs, so
    its verdict and counterexample do not depend on where. A job whose engine ends its
    process is a finding: its machine's journal holds the program (oracle.survival)."""
    rows: list[Row] = []
    names = [f"{job.target.name} ({job.target.level})" for job in jobs] + ["done"]
    progress(sys.stderr, 0, len(jobs), names[0])
    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        here = ray in (None, LOCAL)  # a remote node's journal is on its own disk
        jobs = [replace(job, journal=f"{where}/{i}" if here else "") for i, job in enumerate(jobs)]
        beats = [Path(job.journal) if job.journal else None for job in jobs]
        answers = each_alone(run_job, jobs, workers, ray, beats, quiet())
        try:
            with closing(answers):  # closed, its children end with it (on Ctrl-C too)
                for i, (job, answer) in enumerate(zip(jobs, answers)):
                    rows.append(row_of(job, answer))
                    if tracker is not None:
                        tracker.merge(answer.arcs if isinstance(answer, Done) else {})
                    progress(sys.stderr, i + 1, len(jobs), names[i + 1])  # the next job's name: it runs now
        except KeyboardInterrupt:
            if rows:  # what finished is not lost with the rest
                end_progress(sys.stderr)
                print(table(rows) + f"\n\ninterrupted: {len(rows)} of {len(jobs)} targets finished")
            raise
    return rows


def row_of(job: Job, answer: Done | Ended) -> Row:
    """A job's row; a job whose process ended has its program from its journal."""
    if isinstance(answer, Ended):
        lines = read(Path(job.journal)) if job.journal else None
        result = ended_result(job.target.machine(), lines, answer, partial(prepare, job))
        return target_row(job.target, result, Tally(), result.seconds)
    return target_row(job.target, answer.result, answer.tally, answer.seconds)


def prepare(job: Job) -> None:
    """A replay's process set up as the job's was."""
    job.settings.apply()
    use_target_faults(job.target)


def coverage_tracker(args: argparse.Namespace) -> Tracker | None:
    """Branch coverage of the reference rows, unless --no-coverage or coverage.py is missing."""
    if args.no_coverage:
        return None
    try:
        return Tracker()
    except ImportError:
        print("kvoracle check: coverage.py is not installed: no branch coverage "
              "(pip install coverage; --no-coverage: do not measure it)", file=sys.stderr)
        return None


def report_reach(tracker: Tracker, path: str | None) -> str:
    reach = tracker.reach()
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("".join(f"{line}\n" for line in reach.missing), encoding="utf-8")
    return reach.summary()


def write_json(path: str, rows: Sequence[Row]) -> None:
    """The rows, for a program (kvoracle hunt reads them)."""
    out = [{
        "target": r.target.name, "level": r.target.level, "steps": r.steps, "faults": r.faults,
        "bad_inputs": r.bad_inputs, "verdict": r.verdict, "first_id": r.first_id,
        "shrunk": r.shrunk if r.result else None, "seconds": round(r.seconds, 2), "outcomes": r.outcomes,
        "first_catch": r.result.first_catch if r.result else None, "known": r.known,
        "ended": str(r.result.ended) if r.result and r.result.ended else None,  # its counts then ended with it
        "violation": str(r.result.violation) if r.result else None,
        "counterexample": list(shown(r.result)) if r.result else [],
    } for r in rows]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


def settings_option(args: argparse.Namespace, pool: bool) -> Settings | None:
    """The campaign's settings from the command line, checked and then set in this process
    (with `pool`, the KV backend the scheduler machine will use is named and tried
    before); None, with the reason printed and nothing set, when one is unusable."""
    try:
        settings = Settings(args.fault_rate, args.kv_backend or (default_backend() if pool else ""), args.audit_every,
                            args.step_timeout, args.generator)
        settings.check()
        if pool:  # named, so that workers use it whatever their environment says
            make_pool(settings.kv_backend, "cpu", 1, 2, 1, 8)
        settings.apply()
    except (ValueError, BackendUnavailable, UnknownBackend) as e:
        print(f"kvoracle check: {e}", file=sys.stderr)
        return None
    return settings


def print_unchecked(gaps: Sequence[str]) -> None:
    """Under the table: what this adapter's campaign could not check, and why (the
    adapter's preflight found it)."""
    for gap in gaps:
        print(f"not checked: {gap}")


def reproduce(row: Row, repro_dir: Path) -> None:
    """The row's finding as a standalone file, run once to say whether it fails alone."""
    if row.result is None:
        return
    use_target_faults(row.target)  # the campaign's draws (it ran in a process of its own)
    written = write_reproduction(row.target.machine(), row.result, repro_dir, row.target.name)
    if written is None:
        if row.result.violation is not None and not scripted(row.target.adapter):
            print(f"{row.target.name} ({row.target.level}):\n{NOT_SCRIPTED}")
        return
    path, failure = written
    print(f"{row.target.name} ({row.target.level}):\n{standalone(path, failure, row.result.first_id, str(row.result.violation))}")


def cmd_check_engine(args: argparse.Namespace) -> int:
    from kvoracle.oracle.engine_campaign import engine_table, run_engine
    from kvoracle.oracle.preflight import preflight_alone

    if args.engine and args.adapter:
        print("kvoracle check: --engine and --adapter exclude each other", file=sys.stderr)
        return 2
    try:
        adapter, level = chosen_adapter(args)
    except ValueError as e:
        print(f"kvoracle check: {e}", file=sys.stderr)
        return 2
    scheduler = level == "scheduler"
    refused = [flag for flag, on in (("--mutant", args.mutant is not None), ("--reference-only", args.reference_only),
                                     ("--level", args.level != "all"),
                                     ("--fault-rate", args.fault_rate != FAULT_RATE_DEFAULT and not scheduler),
                                     ("--kv-backend", args.kv_backend and not scheduler), ("--record", args.record),
                                     ("--workers", args.workers > 1), ("--ray", args.ray)) if on]
    if args.repro_dir and not scripted(adapter):
        print("kvoracle check: --repro-dir: the adapter does not derive from oracle.engine.Scripted, so no "
              "reproduction is written", file=sys.stderr)
        return 2
    if refused:
        print(f"kvoracle check: {', '.join(refused)}: not for adapters of the {level} level", file=sys.stderr)
        return 2
    problem = expect_problem(args.expect, level) or output_problem(
        args, (args.repro_dir or REPRO_DIR) if scripted(adapter) else None)
    if problem:
        print(f"kvoracle check: {problem}", file=sys.stderr)
        return 2
    settings = settings_option(args, pool=scheduler)
    if settings is None:
        return 2
    label = str(getattr(adapter, "name"))
    built = preflight_alone(adapter)  # what is wrong with the adapter is said here, not as a finding
    if built.problem:
        print(f"kvoracle check: the {label} adapter {built.problem}", file=sys.stderr)
        return 2
    if level != "engine":
        return check_machine_adapter(args, adapter, level, settings, built.gaps)
    seeds = list(range(args.seed, args.seed + args.seeds))
    campaigns = (False, True) if getattr(adapter, "bad_inputs") else (False,)  # bad input only where it has some
    rows: list[EngineRow] = []
    try:
        for i, bad in enumerate(campaigns):
            progress(sys.stderr, i, len(campaigns), f"{label}{' +bad input' if bad else ''}")
            rows.append(run_engine(adapter, bad, seeds, args.examples, args.steps, Path(args.repro_dir or REPRO_DIR),
                                   Baseline.parse(args.expect) if args.expect else None))
    except KeyboardInterrupt:
        if rows:  # what finished is not lost with the rest
            end_progress(sys.stderr)
            print(engine_table(rows) + f"\n\ninterrupted: {len(rows)} of {len(campaigns)} campaigns finished")
        raise
    progress(sys.stderr, len(campaigns), len(campaigns), "done")
    end_progress(sys.stderr)
    print(engine_table(rows))
    print_unchecked(built.gaps)
    for r in rows:
        if hint := refusals_hint(list(built.gaps), r.tally.refused, r.tally.steps, r.result.passed):
            print(f"note ({r.target}): {hint}")
    for r in rows:
        print_known(r.result.known, f" of {r.target}")
    for r in rows:
        if r.result.violation is None:
            continue
        print(f"\n{r.target}: {r.result.violation}")
        print("\n".join(numbered(r.result)))
        if r.reproduction is not None:
            print(standalone(r.reproduction, r.reproduces, r.result.first_id, str(r.result.violation)))
        elif not scripted(adapter):
            print(NOT_SCRIPTED)
    if args.json:
        write_json(args.json, [as_row(adapter, r) for r in rows])
    found = [r for r in rows if r.result.violation is not None]
    print(f"\n{label}: {len(found)} of {len(rows)} campaigns found a violation")
    return 1 if found else 0


def as_row(adapter: type, r: EngineRow) -> Row:
    """A request-level campaign's row as the other levels' rows, for --json (it injects no faults)."""
    result = r.result
    return Row(Target(r.target, "engine", None, adapter), r.tally.steps, 0, r.tally.bad_inputs, r.verdict,
               result.first_id, len(result.counterexample), None if result.passed else result, r.seconds, {},
               result.known)


def print_known(known: dict[str, int], where: str = "") -> None:
    for pid, programs in sorted(known.items()):
        print(f"known: {pid} in {programs} programs{where} (expected with --expect; not a new finding)")


# What the checker itself reports besides the specification's properties (spec/properties.py).
CHECKER_IDS = ("VALID-INPUT", "BAD-INPUT", "REFINEMENT")


def expect_problem(expect: Sequence[str], level: str) -> str:
    """The first --expect that names no ID a campaign can report, or no step the `level`'s
    machine takes ('' when all do): a typo would otherwise let the known bug it meant go
    on failing, or hide nothing."""
    from kvoracle.spec.properties import PROPERTIES

    valid = [*PROPERTIES, *CHECKER_IDS]
    wrong = next((e for e in expect if e.partition(":")[0] not in valid), None)
    if wrong is not None:
        return f"--expect {wrong}: no such ID; valid: {', '.join(valid)}"
    steps = step_names(level)
    odd = next((e for e in expect if e.partition(":")[2] and not _is_step(e.partition(":")[2], steps)), None)
    return "" if odd is None else (f"--expect {odd}: no step {odd.partition(':')[2]!r} at the {level} level; a STEP is "
                                   f"what a finding's header names after 'after': {', '.join(sorted(steps))}, "
                                   "drain, drain:CALL, bad_input:KIND")


def step_names(level: str) -> set[str]:
    """The steps a finding at `level` may name: its machine's rules and its adapter's calls."""
    from kvoracle.oracle.cache_machine import CacheMachine
    from kvoracle.oracle.engine_machine import EngineMachine
    from kvoracle.oracle.engines import PROTOCOLS
    from kvoracle.oracle.scheduler_machine import DiskMachine

    machine = {"engine": EngineMachine, "cache": CacheMachine, "scheduler": DiskMachine}[level]  # DiskMachine: all the scheduler's rules
    rules = set(stateful.rules(machine))
    protocol = PROTOCOLS[level]
    return rules | {n for n, member in vars(protocol).items() if not n.startswith("_") and callable(member)}


def _is_step(step: str, names: set[str]) -> bool:
    head, _, call = step.partition(":")
    kinds = {b.value for b in BadInput}
    return (step in names or step == "drain" or (head == "drain" and call.isidentifier())
            or (head == "bad_input" and call in kinds))


def chosen_adapter(args: argparse.Namespace) -> tuple[type, str]:
    """--adapter's or --engine's class and its level; ValueError, one line, when it cannot be had."""
    from kvoracle.oracle.engine_campaign import restricted
    from kvoracle.oracle.engines import EngineUnavailable, adapter_class, protocol_of

    try:
        adapter = import_adapter(args.adapter) if args.adapter else adapter_class(args.engine)
    except EngineUnavailable as e:
        raise ValueError(f"--engine {args.engine}: {e}") from None
    level = protocol_of(adapter)
    if args.bad_input and level != "engine":
        raise ValueError(f"--bad-input: only for EngineAdapter adapters; {adapter.__name__} is a {level} adapter")
    return (restricted(adapter, BadInput(args.bad_input)) if args.bad_input else adapter), level


def import_adapter(spec: str) -> type:
    """--adapter's class. Its module is imported here first, so that whatever the import
    raises (a missing dependency, the module's own error) is said in one line, naming it."""
    from kvoracle.oracle.engines import NameTaken, adapter_location, file_module, load_adapter

    try:
        where = adapter_location(spec)[0]
    except ValueError as e:
        raise ValueError(f"--adapter {spec}: {e}") from None
    if not where.endswith(".py") or Path(where).is_file():
        try:
            file_module(where) if where.endswith(".py") else importlib.import_module(where)
        except NameTaken as e:  # kvoracle's refusal, not the module's own error
            raise ValueError(f"--adapter {spec}: {e}") from None
        except Exception as e:
            sys.modules.pop(Path(where).stem, None)  # as Python's import does: no half-run module stays
            why = str(e) if isinstance(e, ImportError) else f"it raised {type(e).__name__}: {e}"
            raise ValueError(f"--adapter {spec}: cannot import {where}: {why}") from None
    try:
        return load_adapter(spec)
    except ValueError as e:
        raise ValueError(f"--adapter {spec}: {e}") from None


def check_machine_adapter(args: argparse.Namespace, adapter: type, level: str, settings: Settings,
                          gaps: Sequence[str]) -> int:
    """A tiered-cache or scheduler adapter: the reference's own machine at that level,
    valid and bad input together, as for the reference (in a process of its own);
    `gaps`: what it leaves unchecked."""
    target = Target(str(getattr(adapter, "name")), level, None, adapter)
    baseline = Baseline.parse(args.expect) if args.expect else None
    seeds = list(range(args.seed, args.seed + args.seeds))
    [row] = run_jobs([Job(target, seeds, args.examples, args.steps, False, settings, baseline)], 1, None)
    use_target_faults(target)  # as its campaign drew: a program journaled by a process the engine ended renders here
    end_progress(sys.stderr)
    print(table([row]))
    print_unchecked(gaps)
    if row.outcomes:
        print("transfers ended: " + ", ".join(f"{k} {n}" for k, n in sorted(row.outcomes.items())))
    print_known(row.known)
    if row.result is not None:
        print(show([row]))
        reproduce(row, Path(args.repro_dir or REPRO_DIR))  # or says why there is none
    if args.json:
        write_json(args.json, [row])
    print(f"\n{target.name}: {'no violation' if row.ok else 'a violation was found'}")
    return 0 if row.ok else 1


def cmd_hunt(args: argparse.Namespace) -> int:
    from kvoracle.oracle.hunt import CATALOGUE, BuildError, CatalogueError, hunt, load

    if not CATALOGUE.exists():
        print("kvoracle hunt: runs from a checkout of kvoracle's repository, which holds the catalogue "
              "(engines/hunt.toml) and the engines' pins; an installed kvoracle has neither: run it (or `make hunt`) "
              "in a clone", file=sys.stderr)
        return 2
    try:
        if args.list:
            for b in load():
                print(f"{b.name:<34} {b.engine} {b.buggy} -> {b.fixed or '(no fix)'}  {b.public}: {b.what}")
            return 0
        text, ok = hunt(args.only, say=lambda msg: print(f"... {msg}", file=sys.stderr, flush=True),
                        generator=args.generator)
    except (CatalogueError, BuildError) as e:
        print(f"kvoracle hunt: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if ok else 1


def cmd_mutants(args: argparse.Namespace) -> int:
    for m in MUTANTS:
        print(f"{m.name:<20} {m.level:<9} bug class {m.bug_class:<3} {m.summary}")
        print(f"{'':<31}mutation: {m.mutation}; killed by {' or '.join(sorted(m.kills))}")
    return 0


def cmd_check_trace(args: argparse.Namespace) -> int:
    from kvoracle.oracle.trace import TraceFormatError, check_trace, decimal_hashes, read_lines

    name = "<stdin>" if args.file == "-" else args.file
    try:
        with open(args.file, "rb") if args.file != "-" else nullcontext(sys.stdin.buffer) as f:  # decoded line by line
            report = check_trace(read_lines(f))
    except OSError as e:
        print(f"kvoracle check-trace: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    except TraceFormatError as e:
        print(f"kvoracle check-trace: {name}: {e}", file=sys.stderr)
        return 2
    if report.passed:
        print(f"{name}: {report.events} event{'' if report.events == 1 else 's'}, no violation")
        if not report.events:
            print("note: the trace has a header and no event: nothing was checked")
        if report.unfinished:
            print(f"note: {report.unfinished}")
        for gap in report.unchecked:
            print(f"not checked: {gap}")
        return 0
    print(f"{name}: first violation at line {report.line}, after {report.events} "
          f"event{'' if report.events == 1 else 's'}:")
    for v in report.violations[:8]:
        print(f"  {v}")
    named = decimal_hashes(report.violations[:8])
    if named:
        print(f"  (the trace writes these hashes in decimal: {named})")
    shown = [(n, line) for n, line in enumerate(report.prefix, 1) if line.strip()]  # by the file's line numbers
    print(f"\nthe shortest prefix that shows it ({len(shown)} lines"
          + (f"; the header and the last {LAST_LINES} shown):" if len(shown) > LAST_LINES + 2 else "):"))
    for i, (n, line) in enumerate(shown):
        if 0 < i < len(shown) - LAST_LINES and len(shown) > LAST_LINES + 2:
            if i == 1:
                print(f"  {'...':>4}  (lines {n} to {shown[-LAST_LINES - 1][0]}: each replays without a violation)")
            continue
        print(f"  {n:>4}  {line if len(line) <= 160 else line[:157] + '...'}")
    return 1


LAST_LINES = 30  # of a long prefix, the lines shown before the violation (the file has the rest)


def record_trace(path: str, events: int, seed: int, level: str = "cache", mutant: str | None = None) -> bool:
    """Record a trace of the reference at `level`, or of `mutant` (the same workload) when
    named; False when nothing could be recorded."""
    from kvoracle.kvcache.manager import CacheManager
    from kvoracle.oracle.mutants import MUTANTS
    from kvoracle.oracle.trace import record, record_scheduler
    from kvoracle.scheduler.resource_manager import ResourceManager

    chosen = next((m for m in MUTANTS if m.name == mutant), None)
    what = f"the reference {level}" if chosen is None else f"mutant {mutant}"
    if chosen is not None and chosen.level != level:
        print(f"kvoracle check: not recorded: {mutant} is a {chosen.level}-level mutant "
              f"(--record-level {chosen.level})", file=sys.stderr)
        return False
    cache_class = CacheManager if chosen is None else chosen.cache_class
    scheduler = (chosen.scheduler_class if chosen is not None else None) or ResourceManager
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # as --json and --coverage-report make theirs
    with open(path, "w", encoding="utf-8") as f:
        try:
            if level == "scheduler":
                n = record_scheduler(f, steps=events, seed=seed, scheduler_class=scheduler, cache_class=cache_class)
            else:
                n = record(f, steps=events, seed=seed, cache_class=cache_class)
        except Exception as e:  # noqa: BLE001 - a mutant may raise: its trace ends at its last whole call
            if chosen is None:
                raise  # the reference itself: a bug to see, not a trace to keep
            print(f"recorded {what} to {path} until it raised {e!r}")
            return True
    print(f"recorded {what} to {path}: a header and {n} event{'s' if n != 1 else ''} (a call may make more than one)")
    if chosen is not None:
        _say_if_unseen(path, mutant or "")
    return True


def _say_if_unseen(path: str, mutant: str) -> None:
    """A mutant's trace that shows no violation says so: its workload never reached the bug
    (a bad call, say, is no part of a recorded workload)."""
    from kvoracle.oracle.trace import check_trace, read_lines

    with open(path, encoding="utf-8") as f:
        report = check_trace(read_lines(f))
    if report.passed:
        print(f"note: this trace shows no violation ({report.events} events): its workload never reached "
              f"{mutant}'s bug (one that only a bad call shows never does); try more --record-events, "
              "another --seed or another mutant")


def cmd_prove(args: argparse.Namespace) -> int:
    from kvoracle.proofs.compiled import CompileError
    from kvoracle.proofs.obligations import ALL_IDS, run_all, uncovered

    if args.deep and args.scope not in (None, "deep"):
        print(f"kvoracle prove: --deep is --scope deep: it excludes --scope {args.scope}", file=sys.stderr)
        return 2
    scope = "deep" if args.deep else args.scope or "ci"
    if args.partitions > 1 and args.workers > 1:
        print("kvoracle prove: --partitions excludes --workers", file=sys.stderr)
        return 2
    if not args.no_crosshair and importlib.util.find_spec("crosshair") is None:  # else 14 rows say so
        print("kvoracle prove: CrossHair is not installed: pip install 'kvoracle[prove]' (crosshair-tool 0.0.113), or run with --no-crosshair",
              file=sys.stderr)
        return 2
    if args.compiled and args.ray:
        print("kvoracle prove: --compiled runs the searches on this machine's processes: it excludes --ray",
              file=sys.stderr)
        return 2
    try:
        with session(args.ray):  # one cluster for every search, not one started per search
            rows = run_all(scope, crosshair=not args.no_crosshair, examples=args.examples, workers=args.workers,
                           ray=args.ray, partitions=args.partitions, compiled_search=args.compiled,
                           progress=lambda msg: print(f"... {msg}", file=sys.stderr, flush=True))
    except CompileError as e:
        print(f"kvoracle prove --compiled: {e}", file=sys.stderr)
        return 2
    print(obligation_runs(rows, args.show))
    missing = [] if args.no_crosshair else uncovered(rows)
    failed = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} obligations hold; "
          f"{len(ALL_IDS) - len(missing)} of {len(ALL_IDS)} property IDs covered"
          + (f"; uncovered: {', '.join(missing)}" if missing else "")
          + "\n(an obligation: one property ID in one run above, shown within that run's bounds only)")
    return 0 if not failed and not missing else 1


def obligation_runs(rows: Sequence[ObligationRow], show: bool = False) -> str:
    """`kvoracle prove`'s rows, one paragraph per run (method, scope, what it explored and
    its time): the IDs under each verdict it gave, wrapped to the width of a terminal, then
    the run's detail (a trace) once, if it failed or `show`."""
    runs: dict[tuple[str, str, str, float], list[ObligationRow]] = {}
    for r in rows:
        runs.setdefault((r.method, r.scope, r.explored, r.seconds), []).append(r)
    out = []
    for (method, scope, explored, seconds), members in runs.items():
        out.append(f"{method}, {scope}: {explored}; {seconds:.1f} s")
        for verdict, ids in _ids_by(members, lambda r: r.verdict, lambda r: True).items():
            out.append(_wrapped(f"  {verdict}: ", ids))
        for detail, ids in _ids_by(members, lambda r: r.detail, lambda r: bool(r.detail and (show or not r.ok))).items():
            out += [_wrapped("  detail of ", ids) + ":", textwrap.indent(detail, "    ")]
    return "\n".join(out)


def _ids_by(rows: Sequence[ObligationRow], key: Callable[[ObligationRow], str],
            wanted: Callable[[ObligationRow], bool]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for r in rows:
        if wanted(r):
            grouped.setdefault(key(r), []).append(r.property_id)
    return grouped


def _wrapped(lead: str, ids: Sequence[str]) -> str:
    return textwrap.fill(" ".join(ids), width=100, initial_indent=lead, subsequent_indent=" " * len(lead),
                         break_on_hyphens=False)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvoracle", description="Check KV-cache block lifecycles against the kvoracle specification.")
    p.add_argument("--version", action=_Version, help="show the version and the digest of the sources, and exit")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="run a checking campaign against the reference and its mutants",
                       description="Runs the stateful machines against the reference (which must pass) and "
                                   "every mutant (each must be caught). Exit status 0 only when all are as expected.")
    c.add_argument("--mutant", metavar="NAME", help="check only this mutant (and the reference rows of its level)")
    c.add_argument("--reference-only", action="store_true",
                   help="check only the reference rows, no mutant: what a change to kvcache/ or scheduler/ must pass")
    c.add_argument("--engine", choices=sorted(ENGINES),
                   help="check this engine through its adapter instead (valid input, then bad input too); "
                        "exit status 1 when a violation is found. docs/engines.md")
    c.add_argument("--adapter", metavar="MODULE:CLASS",
                   help="check your own engine through its adapter (MODULE:CLASS or FILE.py:CLASS), like --engine; "
                        "a TieredAdapter or SchedulerAdapter runs the cache or scheduler machine instead; "
                        "a shipped adapter refuses engine releases outside its range (KVORACLE_NEWER_RELEASES=1 "
                        "drives a newer one anyway)")
    c.add_argument("--bad-input", choices=[b.value for b in REQUEST_LEVEL],
                   help="with --engine/--adapter: make only this kind of bad call in the bad-input campaign")
    c.add_argument("--repro-dir", metavar="DIR",
                   help="where reproduction files of findings are written: with --engine/--adapter (a Scripted "
                        f"adapter) always, default {REPRO_DIR}; for the reference and mutants only when given")
    c.add_argument("--seeds", type=positive, default=campaign.SEEDS,
                   help=f"seeds per target; a mutant's run stops at its first kill (default {campaign.SEEDS})")
    c.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    c.add_argument("--examples", type=positive, default=campaign.EXAMPLES,
                   help=f"programs per seed on the cache machine, half as many on the scheduler machine "
                        f"(default {campaign.EXAMPLES})")
    c.add_argument("--steps", type=positive, default=campaign.STEPS,
                   help=f"max steps per program (default {campaign.STEPS})")
    c.add_argument("--fault-rate", type=float, default=FAULT_RATE_DEFAULT,
                   help="probability that a storage or swap call fails, hangs or answers late (default 0.3)")
    c.add_argument("--level", choices=["cache", "scheduler", "all"], default="all", help="which machines to run (default all: both levels)")
    c.add_argument("--audit-every", type=int, default=1, metavar="N",
                   help="audit every property over the whole state after every N-th step and every step of the "
                        "final drain (default 1: after every step); a larger N is faster, and misses a violation "
                        "that heals before the next audit")
    c.add_argument("--step-timeout", type=float, default=watchdog.LIMIT[0], metavar="SECONDS",
                   help=f"a call into the engine still running after SECONDS is a finding (VALID-INPUT, the engine "
                        f"hung), and the campaign goes on; after one hang, later calls of that run get ten times "
                        f"the longest call that returned, from {watchdog.AFTER_HANG_LEAST:g} to {watchdog.AFTER_HANG:g} s "
                        f"(default {watchdog.LIMIT[0]:g}; 0: no limit)")
    c.add_argument("--generator", choices=campaign.GENERATORS, default=campaign.DEFAULT_GENERATOR,
                   help="who draws the programs: 'hypothesis', 'random' (Python's random over the machines' own "
                        "rules, preconditions and argument strategies, without Hypothesis's engine: more steps per "
                        "second, most at the cache level; its failing program is replayed, then shrunk by deleting "
                        "steps and simplifying arguments), or 'both' (the default): every seed drawn by Hypothesis, "
                        "then, if all pass, every seed drawn at random (docs/mutation.md, 'The random generator'); "
                        "a seed draws other programs with each")
    c.add_argument("--kv-backend", choices=["numpy", "paddle", "torch", "cupy"],
                   help="block-pool backend of the scheduler machine (default: KV_BACKEND, else numpy)")
    c.add_argument("--show", action="store_true",
                   help="print each shrunk counterexample as numbered steps (the reference's targets; with --engine "
                        "or --adapter they are always printed)")
    c.add_argument("--expect", action="append", default=[], metavar="ID[:STEP]",
                   help="with --engine or --adapter: a known violation (anywhere, or after STEP only: the step a "
                        "finding's header names, 'after STEP:', e.g. finish, drain:evict, bad_input:double_free); a "
                        "program that shows only known violations is counted as known and the campaign goes on "
                        "(repeatable)")
    c.add_argument("--workers", type=positive, default=1, metavar="N",
                   help="run the reference's targets on N processes (default 1; not with --engine or --adapter, "
                        "whose campaigns run one after the other); verdicts and counterexamples do not depend on N")
    c.add_argument("--ray", metavar="ADDRESS",
                   help="run the targets on the Ray cluster at ADDRESS ('local': start one on this machine; "
                        "needs the extra kvoracle[ray], and kvoracle installed on every node)")
    c.add_argument("--json", metavar="FILE", help="also write the table's rows, with each counterexample, as JSON")
    c.add_argument("--no-coverage", action="store_true",
                   help="do not measure the branch coverage of kvcache/ and scheduler/ by the reference rows")
    c.add_argument("--coverage-report", metavar="FILE",
                   help="write coverage.py's report of the lines and branches the reference rows never take to FILE")
    c.add_argument("--record", metavar="FILE", help="also write a trace (JSON Lines) of the reference (of the "
                                                    "--mutant, when one is named) to FILE")
    c.add_argument("--record-events", type=positive, default=500,
                   help="lines in the recorded trace after its header, at least (default 500; at the scheduler "
                        "level the schedule/scheduled lines count too)")
    c.add_argument("--record-level", choices=("cache", "scheduler"), default="cache",
                   help="the recorded trace's level (default cache): scheduler records the reference scheduler, "
                        "each scheduling step between schedule and scheduled lines")
    c.add_argument("--record-only", action="store_true",
                   help="with --record: write the trace (seconds) and exit, without the campaign")
    c.set_defaults(func=cmd_check)
    t = sub.add_parser("check-trace", help="check a JSON Lines trace of an engine against the specification",
                       description="Replays each event of the trace as a spec action with the engine's choices, "
                                   "checks every invariant and every observed state, and prints the first "
                                   "violation with the shortest prefix of the trace that shows it (exit 1). "
                                   "Format: docs/trace.md.")
    t.add_argument("file", help="the trace file ('-': read it from standard input)")
    t.set_defaults(func=cmd_check_trace)
    pr = sub.add_parser("prove", help="run every proof obligation and print a paragraph per run",
                        description="Runs the bounded model check of spec/ (and of the FastDeploy-bug mutants), the "
                                    "Hypothesis machines on the reference and the CrossHair contracts. "
                                    "Exit status non-zero when any obligation fails or an ID is uncovered.")
    pr.add_argument("--scope", choices=["quick", "ci", "deep"],
                    help="quick: a small model and few programs (seconds with --no-crosshair; its CrossHair "
                         "contracts take 10 s each, about 80 s in all); ci: the default (a few minutes); "
                         "deep: the larger model-check scope (minutes). Each search stops at its scope's state "
                         "limit: 100,000, 500,000 and 5,000,000 states")
    pr.add_argument("--deep", action="store_true", help="the same as --scope deep")
    pr.add_argument("--workers", type=positive, default=1, metavar="N",
                    help="run the groups of obligations on N processes (default 1)")
    pr.add_argument("--ray", metavar="ADDRESS",
                    help="run the groups of obligations on the Ray cluster at ADDRESS ('local': start one here; needs the extra kvoracle[ray])")
    pr.add_argument("--partitions", type=positive, default=1, metavar="N",
                    help="split each model check's search across N workers (processes here, Ray actors with --ray); "
                         "the groups of obligations then run one after another")
    pr.add_argument("--compiled", action="store_true",
                    help="run the model checks compiled by mypyc (1.6 to 2.5x the states per second; needs mypy, "
                         "the dev extra, and a C compiler; built once per version into $KVORACLE_CACHE, "
                         "else $XDG_CACHE_HOME/kvoracle, else ~/.cache/kvoracle)")
    pr.add_argument("--no-crosshair", action="store_true", help="skip the CrossHair contracts")
    pr.add_argument("--examples", type=positive, default=100, metavar="N",
                    help="Hypothesis programs per machine at the ci scope (default 100); the quick scope runs "
                         "a fifth of them, the deep one five times as many")
    pr.add_argument("--show", action="store_true",
                    help="print each run's detail: the mutants' counterexamples (the violation, then the numbered "
                         "steps) and what CrossHair searched (a failing run's detail is printed without it)")
    pr.set_defaults(func=cmd_prove)
    h = sub.add_parser("hunt", help="the known-bugs benchmark: real bugs of released engines, caught and fixed "
                                    "(from a checkout of the repository)",
                       description="For each real, publicly fixed bug of engines/hunt.toml: runs the campaign "
                                   "against the release that has it (it must be caught with the expected property) "
                                   "and against the first release with the fix (it must pass), each in an "
                                   "environment of its own under .venv-hunt/ (built on first use; minutes and "
                                   "about 0.5 GB each). Exit status 0 only when every row is as expected. It "
                                   "runs from a checkout of kvoracle's repository (the catalogue and the pins are "
                                   "not installed with kvoracle).")
    h.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run only these bugs")
    h.add_argument("--list", action="store_true", help="list the catalogue and exit")
    h.add_argument("--generator", choices=campaign.GENERATORS,
                   help="who draws every campaign's programs (kvoracle check --generator; default: each row's own, "
                        "hypothesis where the catalogue names none)")
    h.set_defaults(func=cmd_hunt)
    m = sub.add_parser("mutants", help="list the mutant catalogue")
    m.set_defaults(func=cmd_mutants)
    return p


HASH_SEED = "0"  # what the command line runs under when PYTHONHASHSEED is unset


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "PYTHONHASHSEED" not in os.environ:
        # an engine may order a set of strings by hash (vLLM 0.29's offloading jobs): under a seed
        # drawn per process its finding would not replay, nor its reproduction confirm it
        os.execve(sys.executable, [sys.executable, "-m", "kvoracle.oracle.cli", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": HASH_SEED})
    args = parse(parser(), argv)
    stdout, sys.stdout = sys.stdout, cast(TextIO, ReaderGone(sys.stdout))
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except ClusterUnavailable as e:
        print(f"kvoracle {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the workers have ended with their generators; no traceback
        end_progress(sys.stderr)
        print("kvoracle: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout
    return code


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """p's arguments. A word no option takes is refused by the subcommand it was given
    to, with that subcommand's usage and its nearest option (argparse leaves it to the
    top level, whose usage lists only the subcommands)."""
    args, extra = p.parse_known_args(argv)
    if extra:
        command = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
        options = [o for a in command._actions for o in a.option_strings]
        near = difflib.get_close_matches(extra[0].partition("=")[0], options, n=1)
        command.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {near[0]}?)" if near else ""))
    return args


class ReaderGone:
    """stdout whose reader may go away (`kvoracle mutants | head`): from then on what is
    written goes to /dev/null, so that the command still does the rest of its work (a
    --json file, say) and exits with its own status, with no BrokenPipeError."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        try:
            return self.out.write(text)
        except BrokenPipeError:
            self.gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.out.flush()
        except BrokenPipeError:
            self.gone()

    def gone(self) -> None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), self.out.fileno())  # Python's flush at exit lands there too

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


positive = at_least(1)  # a count option's type


def version() -> str:
    """The installed version, and the digest of the sources that run (a checkout, or a
    build of the same version from other code, tells itself apart)."""
    from kvoracle.proofs.compiled import sources_digest

    try:
        installed = importlib.metadata.version("kvoracle")
    except importlib.metadata.PackageNotFoundError:
        installed = "(not installed: a checkout)"
    return f"{installed}, sources {sources_digest()}"


class _Version(argparse.Action):
    """--version, its digest taken only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()

if __name__ == "__main__":
    # run as kvoracle.oracle.cli, not as __main__: a Ray worker must import the functions
    # it is sent by name (cloudpickle copies those of __main__, and their globals with them)
    from kvoracle.oracle.cli import main as cli_main

    sys.exit(cli_main())
