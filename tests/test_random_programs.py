"""The random program generator (`kvoracle check --generator random`): it draws from the
machines' own rules and strategies, only what they allow, the same programs from the
same seed; it finds what Hypothesis's engine finds, shrinks it, and a finding that does
not replay is reported as one."""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle import audit, campaign
from kvoracle.oracle.cache_machine import CacheMachine
from kvoracle.oracle.campaign import (EXAMPLES, REPLAY_NAMES, SEEDS, STEPS, RunResult, programs_per_seed, replay,
                                      run_machine, run_seeds)
from kvoracle.oracle.cli import main, run_target, use_target_faults
from kvoracle.oracle.engine import BadInput
from kvoracle.oracle.engine_machine import EngineMachine
from kvoracle.oracle.journal import TEARDOWN, Journal, journaled, read
from kvoracle.oracle.random_programs import Draw, Programs, Unsupported, drawer, rules_of, shown
from kvoracle.oracle.scheduler_machine import (FAULTS, SEARCHED, DiskMachine, SchedulerMachine, _faults, _first_draws,
                                             faults, fewer_faults, use_faults)
from kvoracle.oracle.targets import Target, all_targets
from kvoracle.oracle.violations import Baseline, PropertyViolated
from kvoracle.spec.invariants import Violation
from kvoracle.spec.types import Error, Ok, Partial, Timeout


@pytest.fixture
def random_generator() -> Iterator[None]:
    campaign.set_generator("random")
    try:
        yield
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)


NAMES = {"Ok": Ok, "Error": Error, "Partial": Partial, "Timeout": Timeout, "_faults": _faults, "BadInput": BadInput}


@pytest.mark.parametrize("machine", [CacheMachine, SchedulerMachine, DiskMachine, EngineMachine])
def test_every_rule_of_the_machines_is_drawn_and_printed_as_the_value_it_drew(
        machine: type[RuleBasedStateMachine]) -> None:
    rng = random.Random(0)
    rules = rules_of(machine, REPLAY_NAMES)
    assert {r.name for r in rules} == {n for n in dir(machine) if hasattr(getattr(machine, n), "hypothesis_stateful_rule")}
    for r in rules:
        for name, d in r.arguments.items():
            for _ in range(50):
                value, printed = d.draw(rng)
                assert eval(printed, dict(NAMES)) == value, (r.name, name, printed)


def of(strategy: st.SearchStrategy[Any]) -> Draw:
    return drawer(strategy, REPLAY_NAMES)


def test_draws_stay_in_their_strategies_domain_and_reach_its_ends() -> None:
    rng = random.Random(1)
    ints = [of(st.integers(3, 9)).draw(rng)[0] for _ in range(500)]
    assert set(ints) == set(range(3, 10))
    wide = Counter(of(st.integers(0, 2**32 - 1)).draw(rng)[0] for _ in range(1000))
    assert 100 < wide[0] < 300  # the lower bound one time in five
    picks = [of(st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)).draw(rng)[0]
             for _ in range(500)]
    assert all(isinstance(p, list) and 1 <= len(p) <= 3 and len(set(p)) == len(p) for p in picks)
    assert {len(p) for p in picks if isinstance(p, list)} == {1, 2, 3}
    either = {of(st.one_of(st.none(), st.sampled_from(["a", "b"]))).draw(rng)[0] for _ in range(200)}
    assert either == {None, "a", "b"}
    assert of(st.booleans()).simplest == "False" and of(st.integers(-3, 5)).simplest == "0"
    assert of(st.integers(2, 5)).simplest == "2" and of(st.integers(-5, -2)).simplest == "-2"


@pytest.mark.parametrize("machine", [CacheMachine, SchedulerMachine, DiskMachine, EngineMachine])
def test_every_simpler_value_is_owned_and_no_chain_of_them_comes_back(machine: type[RuleBasedStateMachine]) -> None:
    """Shrinking only ever moves to a strictly simpler value, so it cannot go round in a
    circle (an earlier `one_of` offered None for Ok() and Ok() for None)."""
    rng = random.Random(2)
    for r in rules_of(machine, REPLAY_NAMES):
        for d in r.arguments.values():
            for _ in range(20):
                _, value = d.draw(rng)
                walked = [value]  # a random walk down the simpler values: it never meets itself again
                while (simpler := d.smaller(value)) and len(walked) < 200:
                    value = rng.choice(simpler)
                    assert d.owns(value) and value not in walked, (walked, value)
                    walked.append(value)


class WithBundle(RuleBasedStateMachine):
    blocks = Bundle("blocks")

    @rule(target=blocks)
    def make(self) -> int:
        return 1


class WithInvariant(RuleBasedStateMachine):
    @rule()
    def step(self) -> None:
        pass

    @invariant()
    def holds(self) -> None:
        pass


def test_what_the_generator_cannot_draw_is_refused_by_name() -> None:
    with pytest.raises(Unsupported, match="text"):
        of(st.text())
    with pytest.raises(Unsupported, match="map"):  # printed as a call a replay could not make
        of(st.integers(0, 3).map(lambda x: x + 1))
    with pytest.raises(Unsupported, match="map"):
        of(st.integers(0, 3).map(str))
    with pytest.raises(Unsupported, match="WithBundle.make uses bundles"):
        rules_of(WithBundle, REPLAY_NAMES)
    with pytest.raises(Unsupported, match="WithInvariant.holds is an invariant"):
        rules_of(WithInvariant, REPLAY_NAMES)


class Recording(RuleBasedStateMachine):
    """Every call it receives, and whether each rule's precondition held when it was called."""

    calls: list[tuple[str, object]] = []

    def __init__(self) -> None:
        super().__init__()
        self.held = 0

    @rule(n=st.integers(0, 5))
    def take(self, n: int) -> None:
        self.held += 1
        Recording.calls.append(("take", n))

    @precondition(lambda m: m.held > 0)
    @rule(all_of=st.booleans())
    def give(self, all_of: bool) -> None:
        assert self.held > 0, "called with its precondition false"
        self.held = 0 if all_of else self.held - 1
        Recording.calls.append(("give", all_of))


def test_a_seed_draws_the_same_programs_and_only_steps_whose_preconditions_hold() -> None:
    def drawn(seed: int) -> list[tuple[str, object]]:
        Recording.calls = []
        Programs(Recording, seed, 30, REPLAY_NAMES).run(20)
        return Recording.calls

    first = drawn(3)
    assert first == drawn(3) and first != drawn(4)
    assert {name for name, _ in first} == {"take", "give"}


class Planted(RuleBasedStateMachine):
    """A bug that needs a 7 put beside another value, then a check: the shortest program is
    two puts and a check, and every other argument shrinks to its simplest."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[int] = []

    @rule(x=st.integers(0, 9), twice=st.booleans())
    def put(self, x: int, twice: bool) -> None:
        self.held += [x] * (1 + twice)

    @rule(y=st.integers(0, 3))
    def noise(self, y: int) -> None:
        pass

    @precondition(lambda m: bool(m.held))
    @rule()
    def check(self) -> None:
        if 7 in self.held and len(self.held) >= 2:
            raise PropertyViolated("check", [Violation("INV-CONSERVE", f"a 7 among {len(self.held)} blocks")])


def test_a_planted_bug_is_found_shrunk_to_a_shortest_program_and_replays(random_generator: None) -> None:
    result = run_machine(Planted, seed_value=0, examples=200, steps=30)
    assert not result.passed and result.first_id == "INV-CONSERVE"
    program = list(result.counterexample)
    assert program[-1] == "state.check()" and len(program) in (2, 3), program
    assert result.violation is not None and result.violation.violations[0].message in ("a 7 among 2 blocks",)
    assert all(line in ("state.put(twice=False, x=7)", "state.put(twice=True, x=7)", "state.put(twice=False, x=0)",
                        "state.check()") for line in program), program
    again = replay(Planted, program)
    assert result.violation is not None and again is not None
    assert (result.violation.step, result.violation.violations) == (again.step, again.violations)  # the shown one's


class NeedsAHang(RuleBasedStateMachine):
    """A bug that needs a step whose I/O hangs, whatever the step's other calls do: the
    simplest such step has that one fault, and nothing else can go wrong in it."""

    @rule(f=faults)
    def io(self, f: tuple[Fault, ...]) -> None:
        if any(x.kind is FaultKind.HANG for x in f):
            raise PropertyViolated("io", [Violation("LIVE-TRANSFER", "a call hung")])


def test_a_drawn_list_of_faults_shrinks_to_the_one_fault_that_matters(random_generator: None) -> None:
    """The integer a fault list is drawn from is mixed, so one nearer 0 draws unrelated
    faults: the shrinker takes faults away (or makes them earlier ones) instead."""
    result = run_machine(NeedsAHang, seed_value=0, examples=200, steps=5)
    assert not result.passed and list(result.counterexample) == [result.counterexample[-1]]
    drawn = _faults(int(result.counterexample[-1].removeprefix("state.io(f=_faults(").removesuffix("))")))
    assert [f for f in drawn if f.kind is not FaultKind.OK] == [Fault(FaultKind.HANG)], drawn


def test_each_simpler_fault_list_has_fewer_faults_or_earlier_ones() -> None:
    kinds = list(FAULTS)

    def weight(u: int) -> tuple[int, int]:
        real = [kinds.index(f) for f in _faults(u) if f.kind is not FaultKind.OK]
        return len(real), sum(real)

    rng = random.Random(3)
    offered = 0
    for u in (rng.randrange(1, 2**32) for _ in range(100)):
        simpler = fewer_faults(u)
        assert simpler[0] == 0 and all(weight(n) < weight(u) for n in simpler[1:]), u
        offered += len(simpler) > 1
    assert offered > 50  # most lists of faults have a simpler one among the integers searched


def test_the_table_of_first_draws_draws_as_the_machine_does() -> None:
    """fewer_faults looks integers up in a table that draws every integer of 1..SEARCHED
    at once in numpy: each it names draws the list asked for, and is the least that does."""
    drawn = _first_draws()
    rng = random.Random(4)
    for n in [1, SEARCHED, *(rng.randrange(1, SEARCHED + 1) for _ in range(2000))]:
        least = drawn.least(_faults(n))
        assert least is not None and least <= n and _faults(least) == _faults(n), n
    first: dict[tuple[Fault, ...], int] = {}
    for n in range(1, 1 << 14):
        first.setdefault(_faults(n), n)
    assert all(drawn.least(f) == n for f, n in first.items())
    assert drawn.least((Fault(FaultKind.HANG),) * 8) is None  # a list no integer searched draws


def test_a_list_of_five_faults_has_one_of_four_among_the_simpler() -> None:
    rng = random.Random(6)

    def real(u: int) -> int:
        return sum(f.kind is not FaultKind.OK for f in _faults(u))

    fives = [u for u in (rng.randrange(1, 2**32) for _ in range(3000)) if real(u) == 5]
    shortened = [u for u in fives if any(real(n) == 4 for n in fewer_faults(u))]
    assert len(fives) > 50 and len(shortened) > 0.8 * len(fives), (len(fives), len(shortened))


@pytest.mark.parametrize("name", ["double-free", "write-raise-finish"])
def test_a_mutant_is_caught_with_a_program_that_replays(name: str, random_generator: None) -> None:
    target = next(t for t in all_targets() if t.name == name)
    row = run_target(target, [0, 1], 150, 100)
    assert row.verdict == "caught" and row.result is not None, row
    found = replay(target.machine(), row.result.counterexample)
    assert found is not None and found.first_id == row.first_id


def test_the_command_line_takes_the_generator(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        assert main(["check", "--generator", "random", "--mutant", "double-free", "--seeds", "1", "--examples", "10",
                     "--no-coverage"]) == 0
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    out = capsys.readouterr().out
    assert "pass" in out and "caught" in out, out
    with pytest.raises(SystemExit) as exit_status:
        main(["check", "--generator", "fast"])
    assert exit_status.value.code == 2


@pytest.mark.parametrize("target", all_targets(), ids=lambda t: f"{t.level}-{t.name}")
def test_the_default_campaign_drawn_at_random_kills_every_mutant_and_passes_the_reference(
        target: Target, random_generator: None) -> None:
    """`kvoracle check --generator random`'s verdict on every target, unshrunk (the
    shrinker is judged above): each mutant caught with an ID its bug breaks within the
    default campaign, the reference passing one seed of it."""
    machine = target.machine()
    use_target_faults(target)
    for seed_value in range(SEEDS if target.mutant else 1):
        result = run_machine(machine, seed_value=seed_value, examples=programs_per_seed(target.level, EXAMPLES),
                             steps=STEPS, shrink=False)
        if not result.passed:
            break
    if target.mutant is None:
        assert result.passed, result.violation
    else:
        assert not result.passed and audit.catches(result.first_id, target.mutant.kills), result.violation


class KnownThenUndrained(RuleBasedStateMachine):
    """A known violation in some steps, after which the engine is not to be trusted: a
    teardown run as if nothing had failed finds it undrained (the machines' drain check
    stands down after a failure)."""

    completed = [0]  # programs that ran to their end

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    @rule(x=st.integers(0, 3))
    def step(self, x: int) -> None:
        if x == 3:
            self.failed = True
            raise PropertyViolated("step", [Violation("INV-COUNTERS", "the evictable count drifted")])

    def teardown(self) -> None:
        if self.failed and sys.exc_info()[0] is None:
            raise PropertyViolated("drain", [Violation("LIVE-DRAIN", "blocks left after the drain")])
        type(self).completed[0] += not self.failed


@pytest.mark.parametrize("generator", campaign.DRAWERS)
def test_a_known_violation_ends_its_program_uncounted_with_either_generator(generator: str) -> None:
    campaign.set_generator(generator)
    KnownThenUndrained.completed[0] = 0
    try:
        result = run_machine(KnownThenUndrained, seed_value=0, examples=40, steps=5,
                             baseline=Baseline.parse(["INV-COUNTERS"]))
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    assert result.passed, result.violation
    assert result.known["INV-COUNTERS"] >= 10
    assert KnownThenUndrained.completed[0] >= 40  # the programs asked for ran, besides those a known ID ended


class RaisingPrecondition(RuleBasedStateMachine):
    """An engine whose state query (read by a rule's precondition) raises after 3 steps."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def running(self) -> bool:
        if self.steps >= 3:
            raise ValueError("the engine's queue is corrupt")
        return True

    @precondition(lambda m: m.running())
    @rule(n=st.integers(0, 3))
    def step(self, n: int) -> None:
        self.steps += 1


class KnownAtBuild(RuleBasedStateMachine):
    """An engine whose every build meets a known violation (a thread dying as it connects)."""

    def __init__(self) -> None:
        super().__init__()
        raise PropertyViolated("__init__", [Violation("VALID-INPUT", "by the end of the engine's build, a thread died")])

    @rule()
    def step(self) -> None:
        pass


@pytest.mark.parametrize("generator", campaign.DRAWERS)
def test_a_known_violation_in_every_build_is_a_pass_of_no_steps_with_its_count(generator: str) -> None:
    """Every program ends as it starts, uncounted: the run passes, saying how often it saw
    the known violation (Hypothesis's Unsatisfiable escaped as a traceback before)."""
    campaign.set_generator(generator)
    try:
        result = run_machine(KnownAtBuild, seed_value=0, examples=10, steps=5, baseline=Baseline.parse(["VALID-INPUT"]))
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    assert result.passed, result.violation
    assert result.known["VALID-INPUT"] >= 1


def test_an_exception_in_a_precondition_is_the_finding_with_its_program(random_generator: None) -> None:
    result = run_machine(RaisingPrecondition, seed_value=0, examples=10, steps=10)
    assert result.violation is not None and result.first_id == "VALID-INPUT"
    assert "ValueError" in result.violation.violations[0].message and "no program" not in str(result.violation)
    assert result.counterexample == ("state.step(n=0)",) * 3


def test_a_machine_the_generator_cannot_draw_is_left_to_hypothesis(random_generator: None,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    result = run_machine(WithInvariant, seed_value=0, examples=5, steps=5)
    assert result.passed
    assert "cannot draw WithInvariant's programs (WithInvariant.holds is an invariant)" in capsys.readouterr().err


def test_both_runs_every_seed_drawn_by_hypothesis_then_every_seed_drawn_at_random(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The default generator: Hypothesis's seeds first, so what it catches is reported as
    before; the random pass only where all passed; a machine the random generator cannot
    draw keeps its Hypothesis seeds alone; the first failing seed ends the campaign."""
    calls: list[tuple[str, int]] = []
    fails = {("random", 1)}

    def run(machine: type[RuleBasedStateMachine], *, seed_value: int, examples: int, steps: int,
            baseline: Baseline | None = None, generator: str = "") -> RunResult:
        calls.append((generator, seed_value))
        return RunResult((generator, seed_value) not in fails, None, (), 0.0)

    monkeypatch.setattr(campaign, "run_machine", run)
    assert campaign.GENERATOR[0] == campaign.DEFAULT_GENERATOR == "both"
    assert not run_seeds(CacheMachine, [0, 1, 2], examples=1, steps=1).passed
    assert calls == [("hypothesis", 0), ("hypothesis", 1), ("hypothesis", 2), ("random", 0), ("random", 1)]
    calls.clear()
    fails.add(("hypothesis", 0))
    assert not run_seeds(CacheMachine, [0, 1, 2], examples=1, steps=1).passed
    assert calls == [("hypothesis", 0)]
    calls.clear()
    assert run_seeds(WithInvariant, [1, 2], examples=1, steps=1).passed
    assert calls == [("hypothesis", 1), ("hypothesis", 2)]
    assert "cannot draw WithInvariant's programs (WithInvariant.holds is an invariant): Hypothesis's seeds alone" in (
        capsys.readouterr().err)


def test_both_runs_the_reference_under_each_generator() -> None:
    """The reference passes the default generator's campaign, whose steps are those of
    its Hypothesis pass and of its random pass."""
    steps = {}
    for generator in campaign.GENERATORS:
        campaign.set_generator(generator)
        try:
            row = run_target(Target("reference", "cache", None), [0], 10, 20)
        finally:
            campaign.set_generator(campaign.DEFAULT_GENERATOR)
        assert row.verdict == "pass", row
        steps[generator] = row.steps
    assert steps["both"] == steps["hypothesis"] + steps["random"], steps


def test_a_journal_of_random_programs_replays(tmp_path: Path) -> None:
    """A journaled machine (each program on disk before each step) writes the random
    generator's own printout: drawn faults as `_faults(N)`, which a replay evaluates."""
    use_faults(None)
    machine = journaled(SchedulerMachine, Journal(tmp_path / "journal"))
    programs = Programs(machine, 0, 30, REPLAY_NAMES)
    programs.run(3)
    lines = read(tmp_path / "journal")
    assert lines[-1] == TEARDOWN and "_faults(" in "".join(lines) and "Fault(" not in "".join(lines)
    assert lines[:-1] == [shown(c) for c in programs.program]
    assert replay(SchedulerMachine, lines[:-1]) is None
