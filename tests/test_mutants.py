"""Every mutant in the catalogue is killed by its machine, with a property its bug breaks,
and docs/mutants.md shows exactly those kills; the reference passes. The campaigns are
`kvoracle check`'s default ones (oracle/campaign.py): what they assert is what `make run`
reports.

A run stops at the first seed that kills; the shrunk counterexample is printed
(`pytest -s` shows it) and its length bounded. A mutant that survives fails here.
The campaigns run once, in the page's generator (oracle/mutant_docs.py, in its own
process with PYTHONHASHSEED=0, as `make docs` runs it): the counterexamples judged here
are the page's, and `-k` on one mutant still runs all of them (about 5 minutes).
"""

import os
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvoracle.oracle.campaign import EXAMPLES, SEEDS, STEPS, RunResult, programs_per_seed, run_seeds, shown
from kvoracle.oracle.findings import confirms, run_reproduction, write_reproduction
from kvoracle.oracle.mutants import MUTANTS, Mutant
from kvoracle.oracle.targets import Target, all_targets

# The bounds for FastDeploy's two bugs (the dropped heap node; the write that raised on
# finish); the rest get a generous one. The preempt variant of b is often caught through
# a preemption the scheduler makes itself under memory pressure, a longer program.
MAX_STEPS = {"heap-drop": 8, "write-raise-finish": 6}


# The reference classes a reproduction's preamble names once the bug is removed.
FIXED = {"Cache": "kvoracle.kvcache.manager import CacheManager",
         "Scheduler": "kvoracle.scheduler.resource_manager import ResourceManager"}


@dataclass(frozen=True)
class Generated:
    page_check: subprocess.CompletedProcess[str]  # the generator's --check run
    results: dict[str, RunResult]  # each mutant's campaign, by name


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    results = tmp_path_factory.mktemp("kills") / "results.pickle"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    # the timeout guards against a hang: the campaigns take minutes on a loaded machine
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.mutant_docs", "--check", "--results", str(results)],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert results.exists(), done.stderr[-3000:]
    return Generated(done, pickle.loads(results.read_bytes()))


def test_mutant_page_is_fresh(generated: Generated) -> None:
    assert generated.page_check.returncode == 0, generated.page_check.stderr[-3000:]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_and_its_reproduction_fails_only_with_the_bug(mutant: Mutant, generated: Generated,
                                                                        tmp_path: Path) -> None:
    result = generated.results[mutant.name]
    assert not result.passed, f"mutant {mutant.name} survived {SEEDS} seeds"
    assert result.first_id in mutant.kills, f"{mutant.name} killed by {result.first_id}, expected {mutant.kills}"
    print(f"\n{mutant.name} killed by {result.first_id} in {len(result.counterexample)} steps:")
    print("\n".join(f"  {i}. {step}" for i, step in enumerate(shown(result), 1)))
    assert 1 <= len(result.counterexample) <= MAX_STEPS.get(mutant.name, 20)

    written = write_reproduction(Target(mutant.name, mutant.level, mutant).machine(), result, tmp_path, mutant.name)
    assert written is not None, f"{mutant.name}'s finding has no engine calls to replay"
    path, failure = written
    assert confirms(failure, result.first_id), f"{path.name}: {failure or 'it passes'}"
    text = path.read_text()
    fixed = re.sub(r"^from kvoracle\.oracle\.mutants import \w+ as (Cache|Scheduler)$",
                   lambda m: f"from {FIXED[m.group(1)]} as {m.group(1)}", text, flags=re.M)
    assert fixed != text, "the reproduction does not name the mutant's class"
    (tmp_path / "fixed.py").write_text(fixed)
    assert run_reproduction(tmp_path / "fixed.py") == "", "the reproduction fails on the reference too"


@pytest.mark.parametrize("target", [t for t in all_targets() if t.mutant is None], ids=lambda t: f"{t.level}-{t.name}")
def test_reference_passes_the_same_campaign(target: Target) -> None:
    """Every reference row of `kvoracle check`: the small CPU tier's and the disk's reach
    paths the others do not (the sixteenth blind run's survivor shows on the disk only)."""
    result = run_seeds(target.machine(), range(SEEDS), examples=programs_per_seed(target.level, EXAMPLES), steps=STEPS)
    assert result.passed, str(result.violation)
