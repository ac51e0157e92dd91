"""Traceability: spec/ and docs/ define the same property IDs, and every property is
checked where the design says it must be. (tests/test_mutants.py checks that
docs/mutants.md is fresh.)"""

import re
from collections.abc import Set
from pathlib import Path

from kvoracle.proofs.obligations import CACHE_MACHINE_IDS, MODEL_IDS, SCHEDULER_MACHINE_IDS
from kvoracle.spec.properties import PROPERTIES

ROOT = Path(__file__).resolve().parent.parent
ID = re.compile(r"\b((?:INV|LIVE)-[A-Z]+(?:-[A-Z]+)*)\b")
# Implementation-level properties the abstract model has nothing to say about: it keeps
# no counters (INV-COUNTERS) and no bytes (INV-CONTENT). The machines check them.
NOT_MODELLED = {"INV-COUNTERS", "INV-CONTENT"}


def spec_ids() -> set[str]:
    return set(PROPERTIES)


def test_code_cites_only_defined_ids() -> None:
    cited = {m for d in ("spec", "kvcache", "scheduler", "oracle", "proofs")
             for f in (ROOT / d).rglob("*.py") for m in ID.findall(f.read_text())}
    assert cited <= set(PROPERTIES), sorted(cited - set(PROPERTIES))


def documented_ids() -> set[str]:
    """IDs defined by a row of the properties table in docs/model.md."""
    rows = [line for line in (ROOT / "docs" / "model.md").read_text().splitlines() if line.startswith("| ")]
    return {m.group(1) for line in rows if (m := re.match(r"\| ((?:INV|LIVE)-[A-Z-]+) \|", line))}


def orphans(spec: Set[str], docs: Set[str], machines: Set[str], model: Set[str]) -> list[str]:
    problems = [f"{i} is in spec/ but not documented" for i in sorted(spec - docs)]
    problems += [f"{i} is documented but not in spec/" for i in sorted(docs - spec)]
    problems += [f"{i} is not checked by the stateful machines" for i in sorted(spec - machines)]
    safety = {i for i in spec if i.startswith("INV-")}
    problems += [f"{i} is not checked by the model checker" for i in sorted(safety - model - NOT_MODELLED)]
    live = {i for i in spec if i.startswith("LIVE-")}
    problems += [f"{i} has no obligation" for i in sorted(live - machines - model)]
    return problems


def test_every_id_is_defined_documented_and_checked() -> None:
    spec = spec_ids()
    assert len(spec) == 17, sorted(spec)
    assert orphans(spec, documented_ids(), set(CACHE_MACHINE_IDS) | set(SCHEDULER_MACHINE_IDS), set(MODEL_IDS)) == []


def test_removing_an_id_from_either_side_fails() -> None:
    spec, docs = spec_ids(), documented_ids()
    machines, model = set(CACHE_MACHINE_IDS) | set(SCHEDULER_MACHINE_IDS), set(MODEL_IDS)
    assert orphans(spec - {"INV-PIN"}, docs, machines, model) == ["INV-PIN is documented but not in spec/"]
    assert orphans(spec, docs - {"LIVE-EXIT"}, machines, model) == ["LIVE-EXIT is in spec/ but not documented"]
    assert orphans(spec, docs, machines - {"INV-TREE"}, model) == ["INV-TREE is not checked by the stateful machines"]
    assert orphans(spec, docs, machines, model - {"INV-NO-UAF"}) == ["INV-NO-UAF is not checked by the model checker"]


def test_model_shows_the_generated_counterexample_of_the_write_raise() -> None:
    """docs/model.md copies the steps of write-raise-finish from the generated mutants.md."""
    model = (ROOT / "docs" / "model.md").read_text()
    mutants = (ROOT / "docs" / "mutants.md").read_text()
    shown = model.split("## What must hold after `finish` when the storage write raises")[1].split("```")[1]
    generated = mutants.split("## write-raise-finish")[1].split("```")[1]
    assert shown.strip().splitlines() == generated.strip().splitlines()[: len(shown.strip().splitlines())]
