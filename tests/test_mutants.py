"""Every mutant in the catalogue is killed by its machine, with a property its bug breaks.

A run stops at the first seed that kills; the shrunk counterexample is printed
(`pytest -s` shows it) and its length bounded. A mutant that survives fails here.
"""

import re
from pathlib import Path

import pytest

from kvoracle.oracle.campaign import readable, run_machine
from kvoracle.oracle.findings import confirms, run_reproduction, write_reproduction
from kvoracle.oracle.mutant_docs import SEEDS, kill
from kvoracle.oracle.mutants import MUTANTS, Mutant
from kvoracle.oracle.targets import Target

# The bounds for FastDeploy's two bugs (the dropped heap node; the write that raised on
# finish); the rest get a generous one. The preempt variant of b is often caught through
# a preemption the scheduler makes itself under memory pressure, a longer program.
MAX_STEPS = {"heap-drop": 8, "write-raise-finish": 6}


# The reference classes a reproduction's preamble names once the bug is removed.
FIXED = {"Cache": "kvoracle.kvcache.manager import CacheManager",
         "Scheduler": "kvoracle.scheduler.resource_manager import ResourceManager"}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_and_its_reproduction_fails_only_with_the_bug(mutant: Mutant, tmp_path: Path) -> None:
    result = kill(mutant)
    assert not result.passed, f"mutant {mutant.name} survived {len(SEEDS)} seeds"
    assert result.first_id in mutant.kills, f"{mutant.name} killed by {result.first_id}, expected {mutant.kills}"
    print(f"\n{mutant.name} killed by {result.first_id} in {len(result.counterexample)} steps:")
    print("\n".join(f"  {i}. {readable(s)}" for i, s in enumerate(result.counterexample, 1)))
    assert 1 <= len(result.counterexample) <= MAX_STEPS.get(mutant.name, 20)

    path, failure = write_reproduction(Target(mutant.name, mutant.level, mutant).machine(), result, tmp_path, mutant.name)
    assert confirms(failure, result.first_id), f"{path.name}: {failure or 'it passes'}"
    text = path.read_text()
    fixed = re.sub(r"^from kvoracle\.oracle\.mutants import \w+ as (Cache|Scheduler)$",
                   lambda m: f"from {FIXED[m.group(1)]} as {m.group(1)}", text, flags=re.M)
    assert fixed != text, "the reproduction does not name the mutant's class"
    (tmp_path / "fixed.py").write_text(fixed)
    assert run_reproduction(tmp_path / "fixed.py") == "", "the reproduction fails on the reference too"


@pytest.mark.parametrize("level", ["cache", "scheduler"])
def test_reference_passes_the_same_campaign(level: str) -> None:
    result = run_machine(Target("reference", level, None).machine(), seed_value=0, examples=200, steps=100)
    assert result.passed, str(result.violation)
