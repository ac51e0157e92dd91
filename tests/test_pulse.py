"""A campaign in a process of its own says how far it got while it runs (oracle.pulse)."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis.errors import UnsatisfiedAssumption
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvoracle.oracle import campaign
from kvoracle.oracle.campaign import run_seeds
from kvoracle.oracle.cache_machine import Tally
from kvoracle.oracle.pulse import Pulse, pulsing


class Counter(RuleBasedStateMachine):
    """Fails once a program adds up to 5 or more, when `limit` says so; `rejects`: a
    program that draws 2 is rejected, which is no failure."""

    limit = 10**9
    rejects = False
    tally = Tally()

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @rule(n=st.integers(0, 2))
    def add(self, n: int) -> None:
        type(self).tally.steps += 1
        if type(self).rejects and n == 2:
            raise UnsatisfiedAssumption("rejected")  # as a known violation ends a random program
        self.total += n
        assert self.total < type(self).limit


def machine(**attributes: object) -> type[RuleBasedStateMachine]:
    return type("Counter", (Counter,), {"tally": Tally(), **attributes})


@pytest.fixture(params=["hypothesis", "random"])
def generator(request: pytest.FixtureRequest) -> object:
    campaign.set_generator(request.param)
    yield request.param
    campaign.set_generator(campaign.DEFAULT_GENERATOR)


def test_a_passing_campaign_counts_its_programs_and_no_failure(generator: object) -> None:
    out = io.StringIO()
    pulse = Pulse("counter", out, period=0.0)
    result = run_seeds(pulsing(machine(), pulse), [0], examples=20, steps=10)
    assert result.passed
    assert pulse.programs >= 20 and pulse.failed_at is None
    lines = out.getvalue().splitlines()
    assert len(lines) == pulse.programs  # period 0: a line at every program
    assert lines[-1].startswith(f"kvoracle: counter: {pulse.programs:,} programs, ") and "shrinking" not in lines[-1]


def test_rejected_programs_are_no_failure() -> None:
    campaign.set_generator("random")
    try:
        pulse = Pulse("counter", io.StringIO(), period=0.0)
        run_seeds(pulsing(machine(rejects=True), pulse), [0], examples=20, steps=10)
    finally:
        campaign.set_generator(campaign.DEFAULT_GENERATOR)
    assert pulse.failed_at is None


def test_a_failure_is_noted_and_the_runs_after_it_are_its_shrinking(generator: object) -> None:
    out = io.StringIO()
    pulse = Pulse("counter", out, period=0.0)
    result = run_seeds(pulsing(machine(limit=5), pulse), [0], examples=50, steps=10)
    assert not result.passed
    assert pulse.failed_at is not None
    first, _ = pulse.failed_at
    assert pulse.programs > first  # the shrinker replayed the program
    assert f"; shrinking program {first:,}'s failure (" in out.getvalue().splitlines()[-1]


def test_a_line_only_once_a_period_has_passed() -> None:
    out = io.StringIO()
    pulse = Pulse("counter", out, period=3600.0)
    run_seeds(pulsing(machine(), pulse), [0], examples=20, steps=10)
    assert out.getvalue() == ""


def test_on_a_terminal_the_line_is_redrawn_in_place() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    pulse = Pulse("counter", out, period=0.0)
    pulse.program(7)
    assert out.getvalue().startswith("\rcounter: 1 programs, 7 steps, ") and "\n" not in out.getvalue()
    assert Pulse("x", out).period < Pulse("x", io.StringIO()).period  # a terminal is redrawn more often


def test_stderr_by_default() -> None:
    assert Pulse("x").out is sys.stderr
