"""spec's properties on the partial state an Observation allows (oracle.engine.view_of),
on hand-made observations, and how `kvoracle check --adapter` tells the adapter
Protocols apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvoracle.oracle.engine import Observation, check, view_of, with_observed
from kvoracle.spec import invariants
from kvoracle.oracle.engines import protocol_of
from kvoracle.oracle.engines.reference import ReferenceAdapter
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.spec.invariants import Violation

# Six blocks: 0, 1 free; 2, 3 cached (3 idle; 2 read by a swap-out); 4 in r0's table;
# 5 owned by a transfer (a block a write took over from a request that ended).
SOUND = Observation(ids=range(6), free=(0, 1), evictable=(3,), tables={"r0": (2, 4)}, cached=frozenset({2, 3}),
                    refcounts={2: 1, 3: 0}, pinned=frozenset({2, 5}), in_flight=(5,))
LIVE = {"r0": 4}


def ids(found: list[Violation]) -> list[str]:
    return [v.id for v in found]


def test_a_sound_observation_passes() -> None:
    assert check(SOUND, LIVE, 2) == []


def test_a_block_a_transfer_owns_has_an_owner() -> None:
    unowned = Observation(**{**SOUND.__dict__, "in_flight": ()})
    assert "owned by nobody" in str(check(unowned, LIVE, 2))


def test_without_the_transfers_the_leak_check_is_skipped() -> None:
    unknown = Observation(**{**SOUND.__dict__, "in_flight": None})
    assert check(unknown, LIVE, 2) == []


@pytest.mark.parametrize("free, first, what", [
    ((0, 1, 3), "INV-CONSERVE", "both free and cached"),
    ((0, 1, 5), "INV-CONSERVE", "owned by the free list, a transfer"),
    ((0, 1, 1), "INV-CONSERVE", "on the free list twice"),
    ((0, 1, 9), "INV-TIER", "outside"),
])
def test_conservation(free: tuple[int, ...], first: str, what: str) -> None:
    found = check(Observation(**{**SOUND.__dict__, "free": free}), LIVE, 2)
    assert first in ids(found) and what in str(found)


def test_a_block_a_transfer_reads_must_not_be_free() -> None:
    """vLLM's Mooncake store bug (issue 52360): a preempted request's blocks go back to
    the pool while a store job still reads them."""
    read = Observation(**{**SOUND.__dict__, "tables": {}, "refcounts": None, "pinned": frozenset({4, 5}),
                          "free": (0, 1, 4)})
    found = check(read, {}, 2)
    assert ids(found)[0] == "INV-PIN" and "free while a transfer reads it" in str(found)


def test_the_most_specific_violation_comes_first() -> None:
    """Cached block 2 is on the free list while r0 holds it: INV-NO-UAF leads (spec's
    order), the conservation symptom follows."""
    found = check(Observation(**{**SOUND.__dict__, "free": (0, 1, 2)}), LIVE, 2)
    assert ids(found)[0] == "INV-NO-UAF" and "INV-CONSERVE" in ids(found)


def test_a_tier_without_tables() -> None:
    cpu = Observation(ids=range(2), free=(0,), tables={}, cached=frozenset({0, 1}), counters={"n": (1, 2)})
    gpu = Observation(ids=range(1), free=(0,), tables={}, cached=frozenset())
    assert sorted(set(ids(invariants.check(view_of(gpu, cpu))))) == ["INV-CONSERVE", "INV-COUNTERS"]


def test_observed_violations_add_only_what_the_engine_missed() -> None:
    own = [Violation("INV-CONSERVE", "engine's words")]
    observed = [Violation("INV-CONSERVE", "observation's words"), Violation("INV-COUNTERS", "drift")]
    assert with_observed(own, observed) == own + observed[1:]


def test_each_reference_adapter_is_recognised() -> None:
    assert [protocol_of(c) for c in (ReferenceAdapter, ReferenceCache, ReferenceScheduler)] == \
        ["engine", "cache", "scheduler"]


def test_a_class_of_no_protocol_is_told_what_it_lacks() -> None:
    attrs = {n: getattr(ReferenceCache, n) for n in dir(ReferenceCache) if not n.startswith("_") and n != "complete"}
    with pytest.raises(ValueError, match="NoComplete lacks complete of the TieredAdapter Protocol"):
        protocol_of(type("NoComplete", (), attrs))


# A subclass of a reference adapter over a mutant: your engine, with a bug.
MUTANT_ADAPTER = """
from kvoracle.oracle.engines.{module} import {base}
from kvoracle.oracle.mutants import {mutant}


class Mine({base}):
    name = "mine"
    {attr} = {mutant}
"""


@pytest.mark.parametrize("module, base, attr, mutant, level, first", [
    ("reference_cache", "ReferenceCache", "cache_class", "DoubleFreeAccepted", "cache", "INV-CONSERVE"),
    ("reference_scheduler", "ReferenceScheduler", "scheduler_class", "LeakyAdmit", "scheduler", "LIVE-EXIT"),
])
def test_cli_runs_the_machine_of_the_adapters_protocol(tmp_path: Path, module: str, base: str, attr: str,
                                                       mutant: str, level: str, first: str) -> None:
    source = MUTANT_ADAPTER.format(module=module, base=base, attr=attr, mutant=mutant)
    (tmp_path / "mine.py").write_text(source, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter", f"{tmp_path}/mine.py:Mine",
                           "--seeds", "1", "--examples", "100", "--repro-dir", str(tmp_path / "repro")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert re.search(rf"^mine\s+{level}\s.*\sVIOLATION\s+{first}\s", done.stdout, re.M), done.stdout
    # a Scripted adapter at any level writes its finding as a file that fails alone with the same ID
    assert f"fails standalone with AssertionError: {first}" in done.stdout, done.stdout
    assert len(list((tmp_path / "repro").glob(f"mine_*_{first.lower().replace('-', '_')}.py"))) == 1


def test_cli_refuses_engine_only_options_for_a_deeper_adapter() -> None:
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter",
                           "kvoracle.oracle.engines.reference_cache:ReferenceCache", "--record", "x"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--record: not for adapters of the cache level" in done.stderr, done.stderr
