"""How a checking run reports what it found."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvoracle.spec.invariants import Violation


class PropertyViolated(AssertionError):
    """A stateful machine found a violation; `.violations` carry the property IDs."""

    def __init__(self, step: str, violations: Sequence[Violation]) -> None:
        self.step = step
        self.violations = list(violations)
        lines = "\n".join(f"  {v}" for v in self.violations[:8])
        more = f"\n  ... and {len(self.violations) - 8} more" if len(self.violations) > 8 else ""
        super().__init__(f"after {step}:\n{lines}{more}")

    @property
    def first_id(self) -> str:
        return self.violations[0].id


def refused(name: str, error: type[Exception], call: Callable[[], bool], snapshot: Callable[[], object],
            made: Callable[[], None]) -> None:
    """A bad call must be refused with `error` and change nothing. `call` makes it and
    returns False when it did not apply (then nothing is checked); `made` runs the
    machine's own counting and checks once it was made."""
    before = snapshot()
    raised: Exception | None = None
    try:
        called = call()
    except Exception as e:
        called, raised = True, e
    if not called:
        return
    made()
    if not isinstance(raised, error):
        what = "accepted" if raised is None else f"raised {type(raised).__name__}"
        raise PropertyViolated(name, [Violation("BAD-INPUT", f"expected {error.__name__}, {what}")])
    if snapshot() != before:
        raise PropertyViolated(name, [Violation("BAD-INPUT", f"{error.__name__} raised but the state changed")])
