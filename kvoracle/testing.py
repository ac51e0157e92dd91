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
active Hypothesis settings profile, or from `settings` given here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from hypothesis import settings as Settings
from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.cache_machine import CacheMachine, Tally
from kvoracle.oracle.engine import EngineAdapter
from kvoracle.oracle.engine_machine import EngineMachine, EngineTally
from kvoracle.oracle.scheduler_machine import SchedulerMachine, scheduler_level_machine
from kvoracle.oracle.serving import SchedulerAdapter
from kvoracle.oracle.tiered import TieredAdapter
from kvoracle.oracle.violations import PropertyViolated

__all__ = ["PropertyViolated", "cache_machine", "engine_machine", "machine_for", "scheduler_machine"]

M = TypeVar("M", bound=RuleBasedStateMachine)


def _named(adapter: Callable[[], object]) -> str:
    name = getattr(adapter, "name", None) or getattr(adapter, "__name__", "adapter")
    return "".join(c if c.isalnum() else "_" for c in str(name))


def _machine(base: type[M], adapter: Callable[[], object], attrs: dict[str, object],
             settings: Settings | None) -> type[M]:
    attrs["make_adapter"] = staticmethod(adapter)
    machine = cast(type[M], type(f"{base.__name__}_{_named(adapter)}", (base,), attrs))
    if settings is not None:
        machine.TestCase.settings = settings
    return machine


def cache_machine(adapter: Callable[[], TieredAdapter], *, settings: Settings | None = None) -> type[CacheMachine]:
    """The cache-level machine (tiers, transfers with chosen outcomes, bad input) on `adapter`."""
    return _machine(CacheMachine, adapter, {"tally": Tally()}, settings)


def scheduler_machine(adapter: Callable[[], SchedulerAdapter], *,
                      settings: Settings | None = None) -> type[SchedulerMachine]:
    """The scheduler-level machine (requests, faults in every I/O call, bad input) on `adapter`;
    the disk machine when the adapter also offers `damage_storage`."""
    return _machine(scheduler_level_machine(adapter), adapter, {"tally": Tally()}, settings)


def engine_machine(adapter: Callable[[], EngineAdapter], *, bad_input: bool = False,
                   settings: Settings | None = None) -> type[EngineMachine]:
    """The request-level machine on `adapter`; with `bad_input`, it also makes the raw bad
    calls the adapter declares."""
    return _machine(EngineMachine, adapter, {"tally": EngineTally(), "with_bad_input": bad_input}, settings)


def machine_for(adapter: type, *, settings: Settings | None = None) -> type[RuleBasedStateMachine]:
    """The machine of whichever Protocol `adapter` implements (ValueError names what it lacks)."""
    from kvoracle.oracle.engines import protocol_of

    level = protocol_of(adapter)
    if level == "cache":
        return cache_machine(adapter, settings=settings)
    if level == "scheduler":
        return scheduler_machine(adapter, settings=settings)
    return engine_machine(adapter, settings=settings)
