"""Where Hypothesis's decorators leave a stateful machine's rules: an attribute of each
decorated function (Hypothesis is pinned). The one module that knows those attributes;
journals, replays, the random generator and the command line read rules through it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hypothesis.stateful import RuleBasedStateMachine

_RULE = "hypothesis_stateful_rule"
_NOT_RULES = {"hypothesis_stateful_initialize_rule": "an initialize rule", "hypothesis_stateful_invariant": "an invariant"}


def rules(machine: type[RuleBasedStateMachine]) -> dict[str, Any]:
    """The machine's rules by name, in name order: Hypothesis's record of each (its
    function, arguments, preconditions, bundles)."""
    found = {name: rule(machine, name) for name in sorted(dir(machine))}
    return {name: r for name, r in found.items() if r is not None}


def rule(machine: type[RuleBasedStateMachine], name: str) -> Any | None:
    """Hypothesis's record of the machine's rule `name`; None where `name` is no rule."""
    return getattr(getattr(machine, name, None), _RULE, None)


def other_members(machine: type[RuleBasedStateMachine]) -> dict[str, str]:
    """The machine's initialize rules and invariants, each named with what it is."""
    return {name: what for name in sorted(dir(machine)) for attribute, what in _NOT_RULES.items()
            if getattr(getattr(machine, name), attribute, None) is not None}


class Guarded(Protocol):
    """What `enabled` reads of a rule: its preconditions, each a predicate on the machine."""

    @property
    def preconditions(self) -> Sequence[Callable[[RuleBasedStateMachine], object]]: ...


def enabled(rule: Guarded, state: RuleBasedStateMachine) -> bool:
    """Whether every precondition of `rule` (Hypothesis's record, or anything else with
    its `preconditions`) holds in `state`; what one raises propagates."""
    return all(p(state) for p in rule.preconditions)
