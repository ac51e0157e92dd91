"""What a campaign checks: the reference, and each mutant, each with its machine."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis.stateful import RuleBasedStateMachine

from oracle.cache_machine import CacheMachine, Tally
from oracle.engines.reference_cache import ReferenceCache
from oracle.engines.reference_scheduler import ReferenceScheduler
from oracle.mutants import MUTANTS, Mutant
from oracle.scheduler_machine import SchedulerMachine


@dataclass(frozen=True)
class Target:
    name: str
    level: str  # "cache" or "scheduler"
    mutant: Mutant | None  # None: the reference (or `adapter`), which must pass
    adapter: type | None = None  # another engine, behind the level's adapter Protocol

    def machine(self) -> type[RuleBasedStateMachine]:
        """A fresh machine class (with its own tally) for this target."""
        attrs: dict[str, object] = {"tally": Tally()}
        m = self.mutant
        if self.adapter is not None:
            attrs["make_adapter"] = self.adapter
        elif m is not None and m.scheduler_class is None:
            attrs["make_adapter"] = type(f"ReferenceCache_{self.name.replace('-', '_')}", (ReferenceCache,),
                                         {"cache_class": m.cache_class})
        elif m is not None:
            attrs["make_adapter"] = type(f"ReferenceScheduler_{self.name.replace('-', '_')}", (ReferenceScheduler,),
                                         {"cache_class": m.cache_class, "scheduler_class": m.scheduler_class})
            attrs["bookkeeping"] = m.bookkeeping
        base = CacheMachine if self.level == "cache" else SchedulerMachine
        return type(f"{self.level.title()}Machine_{self.name.replace('-', '_')}", (base,), attrs)


def all_targets() -> list[Target]:
    """The reference at each level first, then every mutant at its level."""
    out = [Target("reference", "cache", None), Target("reference", "scheduler", None)]
    out += [Target(m.name, m.level, m) for m in MUTANTS]
    return out


def tally_of(machine: type[RuleBasedStateMachine]) -> Tally:
    t = getattr(machine, "tally")
    assert isinstance(t, Tally)
    return t
