"""How often the stateful machines run their full audit.

The audit is the walk over everything the engine holds: every safety property of
spec/ on the engine's abstraction and on its observation, and the engine's own
checks. Every step still evaluates what that step alone can show: LIVE-EXIT on the
requests it ends, LIVE-TRANSFER, refinement against the checker's record, an
exception escaping the engine, and (scheduler level) INV-CONTENT.

The audit runs after every `EVERY[0]`-th step, and after every step of the final
drain. 1 (the default) audits after every step. A larger interval buys speed with
detection: a violation that persists is still caught, at most EVERY - 1 steps later
or in the drain, and shrinking still brings its program back to a minimal one; a
violation that heals before the next audit is missed.
"""

from __future__ import annotations

from kvoracle.spec import invariants
from kvoracle.spec.invariants import Violation
from kvoracle.spec.view import View

EVERY = [1]  # the campaign's interval (kvoracle check --audit-every), read at each step

# What every step checks whatever the interval. Between audits a bug can show here first
# (a leak as a refinement difference, say): for a mutant, that counts as caught.
EVERY_STEP = frozenset({"LIVE-EXIT", "LIVE-TRANSFER", "REFINEMENT", "VALID-INPUT", "BAD-INPUT", "INV-CONTENT"})


class Audit:
    """One machine's count of steps since its last audit."""

    def __init__(self) -> None:
        self.since = 0
        self.draining = False  # the final drain audits after every step

    def due(self) -> bool:
        """Whether the step just made is audited (and counting it)."""
        self.since += 1
        if self.draining or self.since >= EVERY[0]:
            self.since = 0
            return True
        return False


def check_interval(every: int) -> None:
    if every < 1:
        raise ValueError(f"the audit interval must be at least 1 step, not {every}")


def set_interval(every: int) -> None:
    check_interval(every)
    EVERY[0] = every


def catches(first_id: str, kills: frozenset[str]) -> bool:
    """Whether a mutant whose table entry is `kills` counts as caught by `first_id`."""
    return first_id in kills or (EVERY[0] > 1 and first_id in EVERY_STEP)


def walk(abstraction: View | None, engine: list[Violation], observed: View) -> list[Violation]:
    """The audit's verdict: spec's properties on the view of the engine's abstraction (None:
    it has none), the engine's own checks, then what only its observation shows; each ID
    once, from the most precise source."""
    found = invariants.check(abstraction) if abstraction is not None else []
    for more in (engine, invariants.check(observed)):
        seen = {v.id for v in found}
        found += [v for v in more if v.id not in seen]
    return invariants.by_severity(found)
