"""kvoracle's stateful machines for an engine's own test suite.

Each factory takes an adapter class (or any callable that builds one) and returns a
Hypothesis RuleBasedStateMachine; its `.TestCase` is a unittest TestCase that pytest
collects like any other:

    import kvoracle.testing
    from my_engine_adapter import MyCache

    TestMyCache = kvoracle.testing.cache_machine(MyCache).TestCase

The machine is the one `kvoracle check --adapter` runs for that Protocol:
`engine_machine` for an EngineAdapter (request level), `cache_machine` for a
TieredAdapter, `scheduler_machine` for a SchedulerAdapter. A failure raises
PropertyViolated, whose message names the property ID and the call after which it
broke; Hypothesis prints the shrunk program. The examples and steps come from the
active Hypothesis settings profile, or from `settings` given here (less Hypothesis's
explain phase, whose "always and only run by failing test cases" lines would point into
kvoracle's own checks, not the engine).

An adapter class is checked when the factory is called: one that lacks a member of its
Protocol, or declares what it cannot (oracle.engines.protocol_of, as `kvoracle check`
does), is a ValueError naming it, not an AttributeError in the middle of a program.

With `isolated=True`, the test runs its machine in a forked process of its own: an
engine that ends the process (os._exit, a crash in native code, a hang no timer
reaches) fails this test with the VALID-INPUT finding and the shrunk program that ended
it, and the test session goes on. Fork copies the process: leave it off once the
session has initialised CUDA (a forked child cannot use it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from kvoracle.oracle.cache_machine import CacheMachine, Tally
from kvoracle.oracle.engine import EngineAdapter
from kvoracle.oracle.engine_machine import EngineMachine, EngineTally
from kvoracle.oracle.scheduler_machine import SchedulerMachine, scheduler_level_machine
from kvoracle.oracle.serving import SchedulerAdapter
from kvoracle.oracle.survival import alone
from kvoracle.oracle.tiered import TieredAdapter
from kvoracle.oracle.violations import PropertyViolated

__all__ = ["PropertyViolated", "cache_machine", "engine_machine", "machine_for", "scheduler_machine"]

M = TypeVar("M", bound=RuleBasedStateMachine)
FACTORIES = {"engine": "engine_machine", "cache": "cache_machine", "scheduler": "scheduler_machine"}


def unexplained(settings: Settings) -> Settings:
    """`settings` without Hypothesis's explain phase, and nothing else changed: its lines
    name kvoracle's own checks (the line that raises PropertyViolated), not the engine."""
    return Settings(settings, phases=[p for p in settings.phases if p is not Phase.explain])


def checked(adapter: Callable[[], object], level: str) -> None:
    """An adapter class must implement the Protocol of `level` ("engine", "cache" or
    "scheduler"): ValueError, naming what it lacks, before any machine runs. A callable
    that is not a class is known only once built, and is left to the machine."""
    from kvoracle.oracle.engines import PROTOCOLS, protocol_of

    if not isinstance(adapter, type):
        return
    factory = FACTORIES[level]
    try:
        found = protocol_of(adapter)
    except ValueError as e:
        raise ValueError(f"kvoracle.testing.{factory}: {e}") from None
    if found != level:
        raise ValueError(f"kvoracle.testing.{factory}: {adapter.__name__} implements the {PROTOCOLS[found].__name__} "
                         f"Protocol, not the {PROTOCOLS[level].__name__} one: use kvoracle.testing.{FACTORIES[found]} "
                         f"(or machine_for)")


def _named(adapter: Callable[[], object]) -> str:
    name = getattr(adapter, "name", None) or getattr(adapter, "__name__", "adapter")
    return "".join(c if c.isalnum() else "_" for c in str(name))


def _machine(base: type[M], adapter: Callable[[], object], attrs: dict[str, object],
             settings: Settings | None, isolated: bool) -> type[M]:
    attrs["make_adapter"] = staticmethod(adapter)
    machine = cast(type[M], type(f"{base.__name__}_{_named(adapter)}", (base,), attrs))
    # the given settings, else the TestCase's own (the active profile's), less the explain phase
    machine.TestCase.settings = unexplained(settings if settings is not None else machine.TestCase.settings)
    if isolated:
        _isolate(machine)
    return machine


def _isolate(machine: type[RuleBasedStateMachine]) -> None:
    """machine.TestCase runs the machine in a process of its own (survival.alone)."""
    case = machine.TestCase

    class Isolated(case):  # type: ignore[valid-type,misc]
        def runTest(self) -> None:
            alone(machine, lambda journaled: run_state_machine_as_test(journaled, settings=self.settings))

    Isolated.__name__, Isolated.__qualname__ = case.__name__, case.__qualname__
    setattr(machine, "TestCase", Isolated)  # a class attribute in place of Hypothesis's descriptor


def cache_machine(adapter: Callable[[], TieredAdapter], *, settings: Settings | None = None,
                  isolated: bool = False) -> type[CacheMachine]:
    """The cache-level machine (tiers, transfers with chosen outcomes, bad input) on `adapter`."""
    checked(adapter, "cache")
    return _machine(CacheMachine, adapter, {"tally": Tally()}, settings, isolated)


def scheduler_machine(adapter: Callable[[], SchedulerAdapter], *, settings: Settings | None = None,
                      isolated: bool = False) -> type[SchedulerMachine]:
    """The scheduler-level machine (requests, faults in every I/O call, bad input) on `adapter`;
    the disk machine when the adapter also offers `damage_storage`."""
    checked(adapter, "scheduler")
    return _machine(scheduler_level_machine(adapter), adapter, {"tally": Tally()}, settings, isolated)


def engine_machine(adapter: Callable[[], EngineAdapter], *, bad_input: bool = False,
                   settings: Settings | None = None, isolated: bool = False) -> type[EngineMachine]:
    """The request-level machine on `adapter`; with `bad_input`, it also makes the raw bad
    calls the adapter declares."""
    checked(adapter, "engine")
    return _machine(EngineMachine, adapter, {"tally": EngineTally(), "with_bad_input": bad_input}, settings,
                    isolated)


def machine_for(adapter: type, *, bad_input: bool = False, settings: Settings | None = None,
                isolated: bool = False) -> type[RuleBasedStateMachine]:
    """The machine of whichever Protocol `adapter` implements (ValueError names what it
    lacks); `bad_input` is for an EngineAdapter's (the other machines always make bad calls)."""
    from kvoracle.oracle.engines import protocol_of

    try:
        level = protocol_of(adapter)
    except ValueError as e:
        raise ValueError(f"kvoracle.testing.machine_for: {e}") from None
    if level == "cache":
        return cache_machine(adapter, settings=settings, isolated=isolated)
    if level == "scheduler":
        return scheduler_machine(adapter, settings=settings, isolated=isolated)
    return engine_machine(adapter, bad_input=bad_input, settings=settings, isolated=isolated)
