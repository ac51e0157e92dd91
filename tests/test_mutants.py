"""Every cache-level mutant is killed by the machine, with the invariant its bug breaks.

The shrunk counterexample is printed (`pytest -s` shows it) and bounded in length.
"""

import pytest

from oracle.campaign import run_machine
from oracle.mutants import CACHE_MUTANTS, Mutant
from oracle.targets import Target

MAX_STEPS = {"heap-drop": 8}  # the bound for seed bug a; others get a generous one


@pytest.mark.parametrize("mutant", CACHE_MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed(mutant: Mutant) -> None:
    machine = Target(mutant.name, "cache", mutant).machine()
    result = run_machine(machine, seed_value=0, examples=300, steps=100)
    assert not result.passed, f"mutant {mutant.name} survived"
    assert result.first_id in mutant.kills, f"{mutant.name} killed by {result.first_id}, expected {mutant.kills}"
    print(f"\n{mutant.name} killed by {result.first_id} in {len(result.counterexample)} steps:")
    print("\n".join(f"  {i}. {s}" for i, s in enumerate(result.counterexample, 1)))
    assert 1 <= len(result.counterexample) <= MAX_STEPS.get(mutant.name, 12)


def test_reference_passes_the_same_campaign() -> None:
    result = run_machine(Target("reference", "cache", None).machine(), seed_value=0, examples=300, steps=100)
    assert result.passed, str(result.violation)
