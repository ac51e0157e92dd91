"""`kvoracle check --engine NAME`: the engine machine on an engine, with valid input and
then with bad input too; each violation becomes a reproduction file that is run once
to confirm that it fails standalone."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvoracle.oracle.campaign import RunResult, counts
from kvoracle.oracle.engine import BadInput, EngineAdapter
from kvoracle.oracle.engine_machine import EngineMachine, EngineTally
from kvoracle.oracle.findings import campaign_suffix, confirms, write_reproduction
from kvoracle.oracle.report import columns
from kvoracle.oracle.survival import run_seeds_alone
from kvoracle.oracle.violations import Baseline


@dataclass(frozen=True)
class EngineRow:
    target: str
    tally: EngineTally
    result: RunResult
    seconds: float
    reproduction: Path | None = None
    reproduces: str = ""  # what the reproduction failed with ('' : it did not fail)

    @property
    def confirmed(self) -> bool:
        """The reproduction fails standalone with the campaign's first violated ID."""
        return confirms(self.reproduces, self.result.first_id, str(self.result.violation))

    @property
    def verdict(self) -> str:
        return "pass" if self.result.passed else "VIOLATION"


def restricted(adapter: type[EngineAdapter], kind: BadInput) -> type[EngineAdapter]:
    """The adapter making only one kind of bad call (to find what each kind does)."""
    if kind not in adapter.bad_inputs:
        known = ", ".join(sorted(b.value for b in adapter.bad_inputs)) or "none"
        raise ValueError(f"{adapter.name} cannot make the bad call {kind.value} (it can make: {known})")
    return type(f"{adapter.__name__}_{kind.value}", (adapter,), {"bad_inputs": frozenset({kind})})


def engine_machine(adapter: type[EngineAdapter], bad_input: bool) -> type[EngineMachine]:
    suffix = "_bad_input" if bad_input else ""
    return type(f"EngineMachine_{adapter.name}{suffix}", (EngineMachine,),
                {"make_adapter": adapter, "with_bad_input": bad_input, "tally": EngineTally()})


def run_engine(adapter: type[EngineAdapter], bad_input: bool, seeds: Sequence[int], examples: int, steps: int,
               repro_dir: Path, baseline: Baseline | None = None) -> EngineRow:
    """The campaign in a process of its own: an engine that ends it is a finding too."""
    machine = engine_machine(adapter, bad_input)
    start = time.perf_counter()
    name = adapter.name + (" +bad input" if bad_input else "")
    result, tally = run_seeds_alone(machine, seeds, examples=examples, steps=steps, baseline=baseline, label=name)
    row = EngineRow(name, tally, result, time.perf_counter() - start)
    written = write_reproduction(machine, result, repro_dir, adapter.name, campaign_suffix(result, bad_input))
    return row if written is None else EngineRow(name, tally, result, row.seconds, *written)


def engine_table(rows: Sequence[EngineRow]) -> str:
    head = ("target", "steps", "refused", "bad inputs", "tolerated", "verdict", "first violated", "shrunk", "time")
    body = [
        (r.target, *counts(r.result, r.tally.steps, r.tally.refused, r.tally.bad_inputs, r.tally.tolerated),
         r.verdict, r.result.first_id or "-", str(len(r.result.counterexample)) if not r.result.passed else "-",
         f"{r.seconds:.1f}s")
        for r in rows
    ]
    return columns(head, body)
