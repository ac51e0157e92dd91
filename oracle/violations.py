"""How a checking run reports what it found."""

from __future__ import annotations

from collections.abc import Sequence

from spec.invariants import Violation


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
