"""What a campaign checks: the reference, and each mutant, each with its machine."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis.stateful import RuleBasedStateMachine

from oracle.cache_machine import CacheMachine, Tally
from oracle.mutants import MUTANTS, Mutant
from oracle.scheduler_machine import SchedulerMachine


@dataclass(frozen=True)
class Target:
    name: str
    level: str  # "cache" or "scheduler"
    mutant: Mutant | None  # None: the reference, which must pass

    def machine(self) -> type[RuleBasedStateMachine]:
        """A fresh machine class (with its own tally) for this target."""
        attrs: dict[str, object] = {"tally": Tally()}
        if self.mutant is not None:
            attrs["cache_class"] = self.mutant.cache_class
            if self.mutant.scheduler_class is not None:
                attrs["scheduler_class"] = self.mutant.scheduler_class
                attrs["bookkeeping"] = self.mutant.bookkeeping
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
