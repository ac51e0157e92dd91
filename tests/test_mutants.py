"""Every mutant in the catalogue is killed by its machine, with a property its bug breaks.

A run stops at the first seed that kills; the shrunk counterexample is printed
(`pytest -s` shows it) and its length bounded. A mutant that survives fails here.
"""

import pytest

from kvoracle.oracle.campaign import readable, run_machine
from kvoracle.oracle.mutant_docs import SEEDS, kill
from kvoracle.oracle.mutants import MUTANTS, Mutant
from kvoracle.oracle.targets import Target

# The bounds for FastDeploy's two bugs (the dropped heap node; the write that raised on
# finish); the rest get a generous one. The preempt variant of b is often caught through
# a preemption the scheduler makes itself under memory pressure, a longer program.
MAX_STEPS = {"heap-drop": 8, "write-raise-finish": 6}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed(mutant: Mutant) -> None:
    result = kill(mutant)
    assert not result.passed, f"mutant {mutant.name} survived {len(SEEDS)} seeds"
    assert result.first_id in mutant.kills, f"{mutant.name} killed by {result.first_id}, expected {mutant.kills}"
    print(f"\n{mutant.name} killed by {result.first_id} in {len(result.counterexample)} steps:")
    print("\n".join(f"  {i}. {readable(s)}" for i, s in enumerate(result.counterexample, 1)))
    assert 1 <= len(result.counterexample) <= MAX_STEPS.get(mutant.name, 20)


@pytest.mark.parametrize("level", ["cache", "scheduler"])
def test_reference_passes_the_same_campaign(level: str) -> None:
    result = run_machine(Target("reference", level, None).machine(), seed_value=0, examples=200, steps=100)
    assert result.passed, str(result.violation)
