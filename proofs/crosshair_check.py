"""Run `crosshair check` over the contracts in proofs/contracts.py, one target at a time.

Each target runs in its own subprocess of this interpreter (the project venv's
python) with an explicit per-condition timeout, and the whole run has a bounded
total. CrossHair never proves anything: "confirmed-none-found" means it searched
until its per-condition timeout and found no counterexample over the inputs the
preconditions admit, nothing more.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MODULE = "kvoracle.proofs.contracts"
ANALYSIS_KIND = "asserts"  # see the module docstring of proofs/contracts.py
ROOT = Path(__file__).resolve().parent.parent

NONE_FOUND = "confirmed-none-found"
COUNTEREXAMPLE = "counterexample"
ERROR = "error"

# Each default target and the invariant / liveness IDs its contract shows.
OBLIGATIONS: dict[str, tuple[str, ...]] = {
    "allocate": ("INV-CONSERVE",),
    "free_batch": ("INV-CONSERVE", "INV-TIER"),
    "take_refs": ("INV-REFCOUNT",),
    "drop_refs": ("INV-REFCOUNT",),
    "heap_offer": ("INV-HEAP-COMPLETE", "INV-HEAP-SOUND"),
    "heap_pop": ("INV-HEAP-COMPLETE", "INV-HEAP-SOUND", "LIVE-EVICT"),
    "exit_request": ("LIVE-EXIT", "INV-CONSERVE", "INV-PIN", "LIVE-TRANSFER"),
}
# Deliberately broken variants: not run by default; CrossHair must find each one.
SEED_BUGS: dict[str, tuple[str, ...]] = {
    "heap_pop_heap_drop": ("INV-HEAP-SOUND",),
    "exit_request_write_raise": ("LIVE-EXIT",),
}

_MESSAGE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<level>error|info|warning): (?P<text>.*)$")


@dataclass(frozen=True)
class ContractResult:
    function: str
    property_ids: tuple[str, ...]
    verdict: str  # NONE_FOUND, COUNTEREXAMPLE or ERROR
    detail: str
    seconds: float


def _short(target: str) -> str:
    return target.removeprefix(MODULE + ".")


def _command(function: str, per_condition_timeout: float) -> list[str]:
    return [
        sys.executable, "-m", "crosshair", "check",
        "--analysis_kind", ANALYSIS_KIND,
        "--per_condition_timeout", str(per_condition_timeout),
        "--report_all",  # one line per condition analysed, so "nothing analysed" is visible
        f"{MODULE}.{function}",
    ]


def parse(output: str, returncode: int, per_condition_timeout: float) -> tuple[str, str]:
    """Verdict and detail from CrossHair's output and exit status (0: none found,
    1: counterexample, 2: other error). A run that analysed no condition is an error."""
    errors: list[str] = []
    analysed = 0
    for line in output.splitlines():
        m = _MESSAGE.match(line.strip())
        if m is None:
            continue
        analysed += 1
        if m["level"] == "error":
            errors.append(f"line {m['line']}: {m['text']}")
    if returncode == 1 and errors:
        return COUNTEREXAMPLE, "\n".join(errors)
    if returncode == 0 and analysed and not errors:
        return NONE_FOUND, (
            f"no counterexample in {analysed} condition(s) within {per_condition_timeout:g} s each (not a proof)"
        )
    last = output.strip().splitlines()[-3:]  # a traceback's last lines name the problem
    return ERROR, f"crosshair exited {returncode}: " + (" / ".join(line.strip() for line in last) or "no output")


def check_one(function: str, per_condition_timeout: float, wall_limit: float) -> ContractResult:
    """Run CrossHair on one contracted function of proofs/contracts.py."""
    name = _short(function)
    ids = OBLIGATIONS.get(name) or SEED_BUGS.get(name) or ()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    try:
        done = subprocess.run(
            _command(name, per_condition_timeout), cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=wall_limit,
        )
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - start
        return ContractResult(name, ids, ERROR, f"killed after {wall_limit:.0f} s wall clock: no verdict, not a "
                                                "counterexample (a loaded machine, or a search that did not end)", seconds)
    verdict, detail = parse(done.stdout + done.stderr, done.returncode, per_condition_timeout)
    return ContractResult(name, ids, verdict, detail, time.monotonic() - start)


def check(
    targets: Sequence[str] | None = None, per_condition_timeout: float = 3.0, total_timeout: float = 120.0
) -> list[ContractResult]:
    """Check each target (default: every OBLIGATIONS entry) in turn. A target gets at
    most its share of wall clock (CrossHair's timeout counts CPU time per condition);
    once the total is spent, the remaining targets are reported as errors, unrun."""
    names = list(OBLIGATIONS) if targets is None else [_short(t) for t in targets]
    per_target = max(4 * per_condition_timeout, per_condition_timeout + 20.0)
    deadline = time.monotonic() + total_timeout
    results: list[ContractResult] = []
    for name in names:
        left = deadline - time.monotonic()
        if left <= 1.0:
            ids = OBLIGATIONS.get(name) or SEED_BUGS.get(name) or ()
            spent = f"not run: the total of {total_timeout:g} s was spent"
            results.append(ContractResult(name, ids, ERROR, spent, 0.0))
            continue
        results.append(check_one(name, per_condition_timeout, min(per_target, left)))
    return results


def main() -> int:
    results = check(sys.argv[1:] or None)
    for r in results:
        print(f"{r.function:26} {r.verdict:21} {r.seconds:6.1f} s  {', '.join(r.property_ids)}")
        if r.verdict != NONE_FOUND:
            print("    " + r.detail.replace("\n", "\n    "))
    return 0 if all(r.verdict == NONE_FOUND for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
