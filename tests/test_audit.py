"""The audit interval (oracle.audit, kvoracle check --audit-every): which steps are
audited, that a violation that persists is still caught between audits, and that a bad
interval is refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvoracle.oracle import audit
from kvoracle.oracle.cli import run_target
from kvoracle.oracle.targets import all_targets


@pytest.fixture
def every() -> Iterator[None]:
    yield
    audit.set_interval(1)


def test_every_nth_step_is_audited_and_every_step_of_the_drain(every: None) -> None:
    audit.set_interval(3)
    a = audit.Audit()
    assert [a.due() for _ in range(7)] == [False, False, True, False, False, True, False]
    a.draining = True
    assert [a.due() for _ in range(3)] == [True, True, True]


def test_the_default_audits_every_step() -> None:
    a = audit.Audit()
    assert all(a.due() for _ in range(5))


@pytest.mark.parametrize("bad", [0, -2])
def test_an_interval_below_one_is_refused_and_the_interval_is_unchanged(every: None, bad: int) -> None:
    audit.set_interval(4)
    with pytest.raises(ValueError, match="at least 1 step"):
        audit.set_interval(bad)
    assert audit.EVERY == [4]


def test_the_cli_refuses_a_bad_interval() -> None:
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--audit-every", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "--audit-every" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["cross-tier", "counter-drift", "write-raise-finish"])
def test_a_lasting_violation_is_caught_between_audits(every: None, name: str) -> None:
    """Mutants whose damage stays (a GPU id on the CPU free list, a counter off by one,
    blocks never freed) are still found: by their own property at the next audit, or
    first by refinement, which every step still checks."""
    audit.set_interval(10)
    target = next(t for t in all_targets() if t.name == name)
    assert target.mutant is not None
    row = run_target(target, [0, 1, 2], 150, 100)
    assert row.verdict == "caught" and row.first_id in target.mutant.kills | audit.EVERY_STEP, row.first_id


def test_only_the_ids_every_step_checks_stand_in_for_a_mutants_own(every: None) -> None:
    kills = frozenset({"INV-TIER"})
    assert not audit.catches("REFINEMENT", kills)  # every step audited: the mutant's own ID only
    audit.set_interval(5)
    assert audit.catches("REFINEMENT", kills) and audit.catches("INV-TIER", kills)
    assert not audit.catches("INV-COUNTERS", kills)  # an audit's ID is no stand-in
