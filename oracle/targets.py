"""What a campaign checks: the reference, and each mutant, each with its machine."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.cache_machine import CacheMachine, Tally
from kvoracle.oracle.engines.reference_cache import ReferenceCache, ReferenceCacheSmallCpu
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler, ReferenceSchedulerOnDisk
from kvoracle.oracle.mutants import MUTANTS, Mutant
from kvoracle.oracle.scheduler_machine import scheduler_level_machine


@dataclass(frozen=True)
class Target:
    name: str
    level: str  # "cache" or "scheduler"
    mutant: Mutant | None  # None: the reference (or `adapter`), which must pass
    adapter: type | None = None  # another engine, behind the level's adapter Protocol

    def machine(self, cache_base: type[ReferenceCache] = ReferenceCache,
                scheduler_base: type[ReferenceScheduler] = ReferenceScheduler) -> type[RuleBasedStateMachine]:
        """A fresh machine class (with its own tally) for this target; the mutant (if
        any) goes into the reference adapter of its level, `cache_base` or `scheduler_base`."""
        attrs: dict[str, object] = {"tally": Tally()}
        m, tag = self.mutant, self.name.replace("-", "_")
        if self.adapter is not None:
            attrs["make_adapter"] = self.adapter
        elif self.level == "cache":
            parts: dict[str, object] = {} if m is None else {"cache_class": m.cache_class, "name": self.name}
            if m is not None and m.cpu_blocks is not None:
                parts["cpu_blocks"] = m.cpu_blocks
            attrs["make_adapter"] = type(f"{cache_base.__name__}_{tag}", (cache_base,), parts)
        else:
            parts = {} if m is None else {"cache_class": m.cache_class, "scheduler_class": m.scheduler_class,
                                          "name": self.name}  # a reproduction's header names the mutant
            if m is not None and m.on_disk:  # the same base, writing through to files the disk damages
                scheduler_base = ReferenceSchedulerOnDisk if scheduler_base is ReferenceScheduler else type(
                    f"{scheduler_base.__name__}OnDisk", (scheduler_base, ReferenceSchedulerOnDisk), {})
            attrs["make_adapter"] = type(f"{scheduler_base.__name__}_{tag}", (scheduler_base,), parts)
            attrs["bookkeeping"] = m is None or m.bookkeeping
        base = CacheMachine if self.level == "cache" else scheduler_level_machine(self.adapter or scheduler_base)
        return type(f"{self.level.title()}Machine_{tag}", (base,), attrs)


def all_targets() -> list[Target]:
    """The reference at each level first (the cache's also with a CPU tier of one block,
    the scheduler's also over a storage tier on disk), then every mutant at its level."""
    out = [Target("reference", "cache", None),
           Target("reference-small-cpu", "cache", None, ReferenceCacheSmallCpu),
           Target("reference", "scheduler", None),
           Target("reference-disk", "scheduler", None, ReferenceSchedulerOnDisk)]
    out += [Target(m.name, m.level, m) for m in MUTANTS]
    return out


def tally_of(machine: type[RuleBasedStateMachine]) -> Tally:
    t = getattr(machine, "tally")
    assert isinstance(t, Tally)
    return t
