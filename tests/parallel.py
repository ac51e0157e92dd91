"""Run the test files in parallel pytest processes, as many at once as there are cores.

`make pytest` calls this: the suite is CPU-bound and one pytest process uses one core.
Runs are handed out longest first, by the seconds in WEIGHTS, so that the last to end
starts early: a long file, or one not listed (it may be long), runs alone; short ones
share a run, which saves their pytest start-ups. Each run's output is printed when it
ends (its summary line, or all of it when it fails), then the totals. The exit status
is 0 only when every run passed.

    python tests/parallel.py [--jobs N] [FILE ...] [-- PYTEST-ARGS ...]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Seconds per file in one serial run on the 2-core CI machine (2026-12-02, rounded up to 1).
# They set only the order and which files share a run; a file not listed runs alone, first.
WEIGHTS: dict[str, int] = {
    "test_mutants.py": 230,
    "test_partitioned.py": 25,
    "test_docs.py": 1,
    "test_black_box.py": 200,
    "test_model_check.py": 115,
    "test_contracts.py": 85,
    "test_campaign.py": 65,
    "test_compiled.py": 57,
    "test_workers.py": 35,
    "test_watchdog.py": 10,
    "test_survival.py": 36,
    "test_audit.py": 31,
    "test_engine_machine.py": 28,
    "test_one_source.py": 27,
    "test_cache_machine.py": 17,
    "test_observation.py": 8,
    "test_scheduler_machine.py": 5,
    "test_checker_strength.py": 1,
    "test_step_deletion.py": 1,
    "test_disk.py": 12,
    "test_engine_fastdeploy.py": 1,
    "test_engine_fastdeploy_chunked.py": 1,
    "test_engine_fastdeploy_tiered.py": 1,
    "test_engine_sglang.py": 1,
    "test_engine_sglang_hicache.py": 1,
    "test_engine_vllm.py": 1,
    "test_engine_vllm_connector.py": 1,
    "test_frontier.py": 1,
    "test_kvcache.py": 1,
    "test_pool.py": 1,
    "test_reference_paths.py": 1,
    "test_scheduler.py": 1,
    "test_shadow.py": 1,
    "test_shadow_sglang.py": 1,
    "test_shadow_vllm.py": 1,
    "test_shadow_vllm_deadlock.py": 1,  # alone, its module-level skip is "no tests ran" (exit 5)
    "test_spec.py": 1,
    "test_storage.py": 1,
    "test_trace.py": 1,
}
LIGHT = 20  # a file that takes less shares a run with others
BATCH = 60  # seconds of short files in one run, at most

COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) ([^\s:]+\.py)", re.M)  # pytest's short test summary


@dataclass
class Outcome:
    files: list[Path]
    returncode: int
    seconds: float
    output: str

    @property
    def summary(self) -> str:
        """pytest's last line: its counts and its time."""
        lines = self.output.strip().splitlines()
        return lines[-1] if lines else f"no output, exit status {self.returncode}"

    def counts(self) -> Counter[str]:
        return Counter({"error" if kind.startswith("error") else kind: int(n)
                        for n, kind in COUNT.findall(self.summary)})

    def failing(self) -> list[str]:
        """The files of this run that pytest's short summary names as failed or in error;
        all of them when it names none (the run itself broke)."""
        named = {Path(m.group(1)).name for m in FAILED_LINE.finditer(self.output)}
        return [f.name for f in self.files if f.name in named] or [f.name for f in self.files]


def weight(run: list[Path]) -> int:
    return sum(WEIGHTS.get(f.name, LIGHT) for f in run)


def plan(files: list[Path]) -> list[list[Path]]:
    """The pytest runs, in the order they start: files not in WEIGHTS first, then by
    weight, the heaviest first; short files packed into runs of up to BATCH seconds."""
    short = sorted((f for f in files if WEIGHTS.get(f.name, LIGHT) < LIGHT), key=lambda f: -WEIGHTS[f.name])
    runs = [[f] for f in files if WEIGHTS.get(f.name, LIGHT) >= LIGHT]
    shared: list[list[Path]] = []
    for f in short:
        fits = next((run for run in shared if weight(run) + WEIGHTS[f.name] <= BATCH), None)
        if fits is None:
            shared.append([f])
        else:
            fits.append(f)
    return sorted(runs + shared, key=lambda run: (run[0].name in WEIGHTS, -weight(run)))


def run_pytest(files: list[Path], pytest_args: list[str]) -> Outcome:
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        done = subprocess.run([sys.executable, "-m", "pytest", *map(str, files), *pytest_args],
                              stdout=log, stderr=subprocess.STDOUT, check=False)
        log.seek(0)
        return Outcome(files, done.returncode, time.perf_counter() - start, log.read())


def run_all(runs: list[list[Path]], jobs: int, pytest_args: list[str]) -> list[Outcome]:
    start, outcomes = time.perf_counter(), []
    print(f"{sum(map(len, runs))} test files in {len(runs)} pytest runs, {jobs} at once", flush=True)
    with ThreadPoolExecutor(jobs) as pool:
        for future in as_completed([pool.submit(run_pytest, run, pytest_args) for run in runs]):
            o = future.result()
            outcomes.append(o)
            names = " ".join(f.name for f in o.files)
            shown = o.output if o.returncode else o.summary + "\n"
            print(f"[{len(outcomes)}/{len(runs)}, {time.perf_counter() - start:.0f} s] {names} "
                  f"({o.seconds:.0f} s): {shown}", end="", flush=True)
    return outcomes


def report(outcomes: list[Outcome], started: float) -> int:
    total = sum((o.counts() for o in outcomes), Counter[str]())
    failed = [name for o in outcomes if o.returncode for name in o.failing()]
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(total.items())) or "no tests ran"
    print(f"{counts} in {time.perf_counter() - started:.0f} s")
    if failed:
        print(f"FAILED: {' '.join(failed)}")
        return 1
    return 0


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    own, pytest_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="pytest processes at once (default: the number of cores)")
    parser.add_argument("files", nargs="*", type=Path, help="test files (default: tests/test_*.py)")
    args = parser.parse_args(own)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    files = args.files or sorted(TESTS.glob("test_*.py"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such test file: {' '.join(missing)}")
    started = time.perf_counter()
    return report(run_all(plan(files), args.jobs, pytest_args), started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
