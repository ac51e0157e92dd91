"""The two program generators side by side on every target of `kvoracle check`: for each,
its verdict, the first violated property, the machine steps run before the first
violation (first catch), the length of the shrunk program and the faults it injects
(a failed, partial, hung or late I/O call of a scheduler-level step), the seconds of the whole
campaign (shrinking included) and its steps per second. A benchmark, not a test: no
asserts; each row is measured here and now, the two generators one after the other.

    python bench/generators.py [--seeds 5] [--examples 150] [--audit-every 1] [--only NAME ...]

The default campaign (5 seeds, 150 programs of 100 steps at the cache level, 75 at the
scheduler level; a mutant's run stops at its first kill) takes about 6 minutes on one
core: most of it Hypothesis's shrinking.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from kvoracle.oracle import audit, campaign
from kvoracle.oracle.campaign import RunResult
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.report import columns
from kvoracle.oracle.targets import all_targets


# a fault as a scheduler-level step's readable faults print it (kvcache.faults.Fault.__str__)
_FAULT = re.compile(r"\b(?:raise|error|hang|partial\(\d+\)|late\(\d+\)|twice\(\d+\))(?=[,\]])")


def faults_in(result: RunResult | None) -> int:
    """The faults a shrunk program injects, as `kvoracle check` prints it."""
    return 0 if result is None or result.passed else sum(len(_FAULT.findall(s)) for s in campaign.shown(result))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=campaign.SEEDS, help="seeds per target, from 0")
    p.add_argument("--examples", type=int, default=campaign.EXAMPLES, help="programs per seed (cache level)")
    p.add_argument("--audit-every", type=int, default=1, metavar="N", help="the audit interval (default 1)")
    p.add_argument("--only", nargs="+", default=[], metavar="NAME", help="only these targets")
    args = p.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        print("note: run with PYTHONHASHSEED=0 for the figures `kvoracle check` gives", file=sys.stderr)
    audit.set_interval(args.audit_every)
    rows = []
    totals: dict[str, list[float]] = {g: [0, 0, 0, 0] for g in campaign.DRAWERS}  # shrunk steps, seconds, steps, faults
    for target in all_targets():
        if args.only and target.name not in args.only:
            continue
        for generator in campaign.DRAWERS:
            campaign.set_generator(generator)
            row = run_target(target, range(args.seeds), args.examples, campaign.STEPS)
            first = row.result.first_catch if row.result is not None else None
            totals[generator][0] += row.shrunk
            totals[generator][1] += row.seconds
            totals[generator][2] += row.steps
            totals[generator][3] += faults_in(row.result)
            rows.append((target.name, target.level, generator, row.verdict, row.first_id or "-",
                         "-" if first is None else f"{first:,}", str(row.shrunk), str(faults_in(row.result)), f"{row.seconds:.1f}",
                         f"{row.steps / row.seconds:,.0f}"))
            print(f"  {target.name} ({generator}): {row.verdict}", file=sys.stderr, flush=True)
    campaign.set_generator(campaign.DEFAULT_GENERATOR)
    for generator, (shrunk, seconds, steps, faults) in totals.items():
        rows.append(("all", "", generator, "", "", "", f"{shrunk:.0f}", f"{faults:.0f}", f"{seconds:.1f}",
                     f"{steps / seconds:,.0f}"))
    print(columns(("target", "level", "generator", "verdict", "first ID", "first catch", "shrunk", "faults", "seconds",
                   "steps/s"), rows))


if __name__ == "__main__":
    main()
