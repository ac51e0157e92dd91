"""One source of truth: each property is defined once, in spec/, and every checker (the
model checker, the machines, the observation checks, the trace checker) evaluates that
definition. Weakening one predicate in spec/ changes all their verdicts together."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvoracle.oracle import findings
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.mutants import by_name
from kvoracle.oracle.targets import Target
from kvoracle.oracle.trace import check_trace, read_lines
from kvoracle.proofs.model_check import explore
from kvoracle.proofs.obligations import MUTANT_SCOPE
from kvoracle.spec import invariants, refinement
from kvoracle.spec.next import init
from kvoracle.spec.properties import DEFINED_BY, PROPERTIES
from kvoracle.spec.state import CacheState

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("spec", "kvcache", "scheduler", "oracle", "proofs")
# Not checkers, and each says so: the reference's own structural audit (links, child
# counts, bitmaps: what no abstraction carries) and the CrossHair lemmas, which state
# per-kernel contracts over plain lists (docs/proofs.md).
EXEMPT = {Path("kvcache/abstraction.py"), Path("proofs/contracts.py")}
ID = r"(?:INV|LIVE)-[A-Z]+(?:-[A-Z]+)*"


def definitions() -> dict[str, list[str]]:
    """Every function whose docstring opens with a property ID, by that ID."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.FunctionDef):
                    continue
                m = re.match(rf"({ID}):", ast.get_docstring(node) or "")
                if m:
                    found.setdefault(m.group(1), []).append(f"{path.relative_to(ROOT)}:{node.name}")
    return found


def test_each_property_is_defined_once_in_spec() -> None:
    found = definitions()
    assert set(found) == set(PROPERTIES), sorted(set(found) ^ set(PROPERTIES))
    for pid, where in found.items():
        assert len(where) == 1 and where[0].startswith("spec/"), f"{pid} is defined in {where}"
        assert DEFINED_BY[pid].__module__ == "kvoracle." + where[0].split(":")[0][:-3].replace("/", ".")
        assert DEFINED_BY[pid].__name__ == where[0].split(":")[1]


def test_no_checker_restates_a_property() -> None:
    """Outside spec/, nothing builds a violation of a property ID: checkers get theirs
    from spec's predicates."""
    pattern = re.compile(rf'Violation\(\s*"{ID}"')
    offenders = [f"{path.relative_to(ROOT)}:{n}" for package in PACKAGES if package != "spec"
                 for path in sorted((ROOT / package).rglob("*.py")) if path.relative_to(ROOT) not in EXEMPT
                 for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []


def heap_drop_verdicts() -> tuple[str, str, str]:
    """The first ID the model checker, the cache machine and the trace checker report
    for FastDeploy's dropped heap node."""
    model = explore(MUTANT_SCOPE, "heap-drop")
    machine = run_machine(Target("heap-drop", "cache", by_name("heap-drop")).machine(), seed_value=0,
                          examples=300, steps=100)
    trace = check_trace(read_lines((ROOT / "docs" / "examples" / "heap_drop.jsonl").read_text().splitlines()))
    return model.violation[0].id, machine.first_id, trace.violations[0].id


def test_weakening_one_predicate_changes_every_checker_together(monkeypatch: pytest.MonkeyPatch) -> None:
    assert heap_drop_verdicts() == ("INV-HEAP-SOUND",) * 3
    monkeypatch.setitem(invariants.SAFETY, "INV-HEAP-SOUND", lambda view: [])  # a test-only weakening
    weakened = heap_drop_verdicts()
    assert "INV-HEAP-SOUND" not in weakened and all(weakened), weakened


def test_refinement_is_judged_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machines and the reproductions they write all compare states through
    spec.refinement: a difference planted there reaches every one of them."""
    monkeypatch.setattr(refinement, "differences", lambda want, got: ["planted"])  # a test-only strengthening
    for level in ("cache", "scheduler"):
        result = run_machine(Target("reference", level, None).machine(), seed_value=0, examples=5, steps=20)
        assert result.first_id == "REFINEMENT" and "planted" in str(result.violation), (level, result.violation)
    state = init(MUTANT_SCOPE).cache

    class Abstracted:
        def abstract(self) -> CacheState:
            return state

    assert [v.message for v in findings._refines(Abstracted(), repr(state))] == [
        "the engine's state differs from the specification's: planted"]
