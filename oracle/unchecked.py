"""What a campaign cannot check through an adapter: the properties, or their clauses,
that need the abstraction the adapter does not give, or an observation field it leaves
out. `kvoracle check` prints them under the table, so a pass says how much it covers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvoracle.oracle.engine import Observation, Op

# Without `cached`, a used block no table or transfer holds may be the cache's: a leak passes
LEAKS_UNSEEN = ("INV-CONSERVE's and LIVE-EXIT's owner of each used block, so a leaked block (held by "
                "nobody) passes (an engine without a prefix cache says so with cached=frozenset())")

# observation field -> what stays unchecked without it, and the tiers it is read on
NEEDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("free", "INV-CONSERVE's free list and LIVE-DRAIN", ("GPU", "CPU")),
    ("tables", "INV-NO-UAF, INV-REQUEST and LIVE-EXIT", ("GPU",)),
    ("cached", LEAKS_UNSEEN, ("GPU", "CPU")),
    ("evictable", "LIVE-EVICT and INV-PIN's evictable clause", ("GPU",)),
    ("refcounts", "INV-REFCOUNT", ("GPU",)),
    ("pinned", "INV-PIN", ("GPU", "CPU")),
    ("in_flight", "INV-CONSERVE's ownership by transfers", ("GPU", "CPU")),
    ("nodes", "INV-HEAP-SOUND on the tree's nodes", ("GPU", "CPU")),
    ("findable", "INV-HEAP-SOUND on the eviction structure", ("GPU", "CPU")),
)
NO_ABSTRACTION = ("REFINEMENT, INV-TREE, INV-HEAP-COMPLETE, the in_heap flags of INV-HEAP-SOUND and the "
                  "child <= parent clause of INV-REFCOUNT: {why}")


def unchecked(adapter: Any) -> list[str]:
    """One line per gap, for an adapter just built (an empty list: spec/ is checked whole,
    on the abstraction)."""
    gaps: list[str] = []
    if hasattr(adapter, "events") and not hasattr(adapter, "content"):
        gaps.append("INV-CONTENT: the adapter gives no content()")
    abstraction = getattr(adapter, "abstract", None) or getattr(adapter, "state", None)
    if abstraction is not None and abstraction() is not None:
        return gaps
    why = ("its abstract() or state() gives None" if abstraction is not None
           else "the request-level Protocol has no abstraction (a TieredAdapter or SchedulerAdapter can give one)")
    gaps.append(NO_ABSTRACTION.format(why=why))
    seen = {"GPU": adapter.observe()}
    if hasattr(adapter, "observe_cpu"):
        seen["CPU"] = adapter.observe_cpu()
    gaps += observation_gaps(seen)
    if Op.EVICT not in getattr(adapter, "operations", {Op.EVICT}):  # the engine machine's drain (engine_machine.drain)
        gaps.append("LIVE-DRAIN's eviction: the adapter drives none (no Op.EVICT), so the drain counts the cached "
                    "blocks nobody holds as freed" if seen["GPU"].cached is not None else
                    "LIVE-DRAIN: the adapter drives no eviction (no Op.EVICT) and observes no `cached`")
    if not any(o.counters for o in seen.values()):
        gaps.append("INV-COUNTERS: no kept counters")
    return gaps


def observation_gaps(seen: Mapping[str, Observation]) -> list[str]:
    """One line per field these observations (tier -> observation) leave out, saying what
    its absence leaves unchecked (shared by `kvoracle check` and shadow mode's summary)."""
    gaps = []
    for field, what, tiers in NEEDS:
        missing = [t for t in tiers if t in seen and getattr(seen[t], field) is None]
        if missing:
            gaps.append(f"{what}: no `{field}` in the {' and '.join(missing)} observation")
    return gaps


def refusals_hint(gaps: list[str], refused: int, steps: int, passed: bool) -> str:
    """A line for a campaign whose engine refused most calls for want of room while its
    leaks go unseen: the one symptom of a leak such a campaign shows; or for one that
    passed without a single refusal: the paths of a full pool never ran. '' otherwise."""
    if passed and steps and not refused:
        return (f"none of {steps:,} steps was refused for want of room: what the engine does when its pool is full "
                "never ran; build it with fewer blocks in the adapter (or draw more --steps)")
    if steps == 0 or 2 * refused < steps or not any(LEAKS_UNSEEN in g for g in gaps):
        return ""
    return (f"{refused:,} of {steps:,} steps were admissions or growths refused for want of room: with no "
            "`cached` in the observation a leaked block cannot be told from a cached one; if the engine has "
            "no prefix cache, report cached=frozenset()")
