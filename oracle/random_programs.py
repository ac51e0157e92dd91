"""Random programs for a stateful machine, drawn without Hypothesis's engine.

Hypothesis spends about half of a machine step choosing the rule and drawing its
arguments (`make bench`: the cache machine's rules alone). This draws programs from the
same rules, preconditions and argument strategies with Python's `random`
(`kvoracle check --generator random`): a program runs its steps straight
on the machine, and one that fails is printed as Hypothesis prints a program
(`state.rule(arg=value, ...)`), replayed to confirm it, then shrunk here (`shrink`): runs
of steps deleted, then each argument made simpler, for as long as the program, replayed
with each step's preconditions, still ends in the same finding.

Each program enables a random subset of the rules (swarm testing, as Hypothesis's
feature flags do), then takes up to `steps` steps, each a rule whose preconditions hold,
with arguments drawn uniformly (a wide integer range draws its lower bound one time in
five: 0 is where a fault draw means no fault). Machines with initialize rules, bundles
or invariants are Hypothesis's alone (`Unsupported`: the campaign says so and lets
Hypothesis draw them), as are strategies other than integers, booleans, sampled_from,
just/none, one_of, lists of those, and map by a function a replay knows by name
(`campaign.REPLAY_NAMES`: a mapped value prints as the call that made it, `_faults(12)`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis.errors import UnsatisfiedAssumption
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.strategies import SearchStrategy
from hypothesis.vendor.pretty import pretty

from kvoracle.oracle import interrupts, stateful
from kvoracle.oracle.step_deletion import delete_runs

WIDE = 64  # an integer range wider than this draws its lower bound one time in five


class Unsupported(TypeError):
    """A machine or strategy this generator cannot draw from (Hypothesis's engine can)."""


@dataclass(frozen=True)
class Draw:
    """How to draw one argument and how a program prints what was drawn; for shrinking,
    the printed simplest value, whether a printed value is one this draws (`owns`), and
    the printed values simpler than one it owns, simplest first. Each is strictly
    simpler in one well-founded order (nearer the simplest integer, an earlier element
    or branch, a shorter list), so shrinking never goes round in a circle."""

    draw: Callable[[random.Random], tuple[object, str]]
    simplest: str
    owns: Callable[[str], bool]
    smaller: Callable[[str], list[str]]


def drawer(strategy: SearchStrategy[Any], names: Mapping[str, object]) -> Draw:
    """The Draw of a strategy; Unsupported where it is not one this module knows. A mapped
    value prints as a call to its function, which must be among `names` (those a
    replay evaluates printed steps with)."""
    s = _unwrapped(strategy)
    kind = type(s).__name__
    if kind == "IntegersStrategy":
        return _integers(s.start, s.end)
    if kind == "BooleansStrategy":
        return _sampled([False, True])
    if kind in ("SampledFromStrategy", "JustStrategy") and not s._transformations:
        return _sampled(list(s.elements))
    if kind == "OneOfStrategy":
        return _one_of([drawer(branch, names) for branch in s.original_strategies])
    if kind == "MappedStrategy" and _replayable(s.pack, names):
        return _mapped(drawer(s.mapped_strategy, names), s.pack)
    if kind in ("ListStrategy", "UniqueListStrategy", "UniqueSampledListStrategy"):
        return _lists(drawer(s.element_strategy, names), s.min_size, s.max_size, kind != "ListStrategy")
    raise Unsupported(f"no random drawer for the strategy {strategy!r}")


def _replayable(function: object, names: Mapping[str, object]) -> bool:
    return names.get(getattr(function, "__name__", "")) is function


def _unwrapped(strategy: SearchStrategy[Any]) -> Any:
    s: Any = strategy
    while hasattr(s, "wrapped_strategy"):
        s = s.wrapped_strategy
    return s


def _integers(start: int | None, end: int | None) -> Draw:
    if start is None or end is None:
        raise Unsupported("an unbounded integer strategy")
    wide = end - start > WIDE
    simplest = max(start, min(0, end))

    def draw(rng: random.Random) -> tuple[object, str]:
        value = start if wide and rng.random() < 0.2 else rng.randint(start, end)
        return value, repr(value)

    def owns(shown: str) -> bool:
        return shown.lstrip("-").isdigit() and start <= int(shown) <= end

    def smaller(shown: str) -> list[str]:
        """Towards the simplest: it, then halfway, then one step."""
        v = int(shown)
        toward = 1 if v < simplest else -1
        found = [simplest, simplest + (v - simplest) // 2, v + toward] if v != simplest else []
        return [repr(c) for c in dict.fromkeys(found) if c != v]

    return Draw(draw, repr(simplest), owns, smaller)


def _sampled(elements: list[object]) -> Draw:
    shown = [pretty(e) for e in elements]
    first = {text: shown[: shown.index(text)] for text in reversed(shown)}  # a repeated element: its first place

    def draw(rng: random.Random) -> tuple[object, str]:
        i = rng.randrange(len(elements))
        return elements[i], shown[i]

    return Draw(draw, shown[0], first.__contains__, lambda text: list(dict.fromkeys(first.get(text, []))))


def _one_of(branches: list[Draw]) -> Draw:
    def owns(shown: str) -> bool:
        return any(b.owns(shown) for b in branches)

    def smaller(shown: str) -> list[str]:
        """The simplest of each earlier branch, then the simpler ones of its own."""
        own = next(i for i, b in enumerate(branches) if b.owns(shown))
        found = [b.simplest for b in branches[:own]] + branches[own].smaller(shown)
        return [c for c in dict.fromkeys(found) if c != shown]

    return Draw(lambda rng: rng.choice(branches).draw(rng), branches[0].simplest, owns, smaller)


# Functions whose integer argument shrinks by the order of what they map it to, not towards 0:
# each with the integers whose values are simpler than a given one's (see `shrink_mapped_by`).
_SIMPLER_INPUTS: dict[object, Callable[[int], list[int]]] = {}


def shrink_mapped_by(function: Callable[[int], object], simpler: Callable[[int], list[int]]) -> None:
    """Shrink a value drawn as `function(n)` through `simpler(n)`: the integers whose values
    are strictly simpler than n's in one well-founded order of the values, simplest first.
    For a function that mixes its argument (as a fault draw does), an integer nearer 0 maps
    to an unrelated value, so the integer's own order shrinks nothing."""
    _SIMPLER_INPUTS[function] = simpler


def _mapped(inner: Draw, pack: Callable[[object], object]) -> Draw:
    name = pack.__name__
    by_value = _SIMPLER_INPUTS.get(pack)

    def draw(rng: random.Random) -> tuple[object, str]:
        value, shown = inner.draw(rng)
        return pack(value), f"{name}({shown})"

    def inside(shown: str) -> str:
        return shown.removeprefix(f"{name}(").removesuffix(")")

    def owns(shown: str) -> bool:
        return shown.startswith(f"{name}(") and shown.endswith(")") and inner.owns(inside(shown))

    def smaller(shown: str) -> list[str]:
        argument = inside(shown)
        if by_value is None:
            return [f"{name}({c})" for c in inner.smaller(argument)]
        found = [repr(n) for n in by_value(int(argument))]
        return [f"{name}({c})" for c in found if inner.owns(c) and c != argument]

    return Draw(draw, f"{name}({inner.simplest})", owns, smaller)


def _lists(element: Draw, least: int, most: float | int, unique: bool) -> Draw:
    top = least + 8 if most == float("inf") else int(most)

    def draw(rng: random.Random) -> tuple[object, str]:
        values: list[object] = []
        shown: list[str] = []
        size = rng.randint(least, top)
        for _ in range(4 * size):  # a unique list retries a repeat, a few times
            if len(values) == size:
                break
            value, text = element.draw(rng)
            if not (unique and value in values):
                values.append(value)
                shown.append(text)
        return values, _listed(shown)

    def items(shown: str) -> list[str] | None:
        """The printed elements (split at commas: a list of values printed with one is
        not split, and does not shrink)."""
        found = shown[1:-1].split(", ") if shown != "[]" else []
        return found if all(element.owns(x) for x in found) else None

    def owns(shown: str) -> bool:
        found = items(shown) if shown.startswith("[") and shown.endswith("]") else None
        return found is not None and least <= len(found) <= top and not (unique and len(set(found)) < len(found))

    def smaller(shown: str) -> list[str]:
        """One element fewer, each in turn; then each element simpler."""
        found = items(shown) or []
        shorter = [found[:i] + found[i + 1 :] for i in range(len(found))] if len(found) > least else []
        simpler = [found[:i] + [c] + found[i + 1 :] for i, x in enumerate(found) for c in element.smaller(x)]
        return [_listed(c) for c in shorter + simpler if not (unique and len(set(c)) < len(c))]

    return Draw(draw, _listed([element.simplest] * least), owns, smaller)


def _listed(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


@dataclass(frozen=True)
class Rule:
    name: str
    function: Callable[..., object]
    preconditions: tuple[Callable[[Any], bool], ...]
    arguments: dict[str, Draw]  # sorted by name, as Hypothesis prints them


def rules_of(machine: type[RuleBasedStateMachine], names: Mapping[str, object]) -> list[Rule]:
    """The machine's rules, in name order (`names`: what a replay evaluates printed steps
    with); Unsupported where it needs Hypothesis's engine."""
    others = stateful.other_members(machine)
    if others:
        name = min(others)
        raise Unsupported(f"{machine.__name__}.{name} is {others[name]}")
    found = []
    for name, rule in stateful.rules(machine).items():
        if rule.bundles or rule.targets:
            raise Unsupported(f"{machine.__name__}.{name} uses bundles")
        arguments = {k: drawer(v, names) for k, v in sorted(rule.arguments.items())}
        found.append(Rule(name, rule.function, tuple(rule.preconditions), arguments))
    if not found:
        raise Unsupported(f"{machine.__name__} has no rules")
    return found


Call = tuple[str, dict[str, str]]  # a step as printed: the rule's name, each argument's printed value


def shown(call: Call) -> str:
    name, arguments = call
    return f"state.{name}({', '.join(f'{k}={v}' for k, v in arguments.items())})"


PRINTED = "kvoracle_printed_step"  # the machine attribute a journaled rule reads its step's printout from


class Programs:
    """Random programs of one machine from one seed (`names`: what a replay evaluates
    printed steps with)."""

    def __init__(self, machine: type[RuleBasedStateMachine], seed_value: int, steps: int,
                 names: Mapping[str, object]) -> None:
        self.machine = machine
        self.rules = rules_of(machine, names)
        self.rng = random.Random(f"kvoracle random programs {seed_value}")
        self.steps = steps
        self.program: list[Call] = []  # the steps of the program running, or of the one that failed

    def run(self, examples: int) -> None:
        """Run programs until `examples` of them ran to their end; the first failure
        propagates (EngineInterrupt for the engine's own KeyboardInterrupt), and `program`
        is then the steps of the program that raised, its failing step last. A program
        ended by a known violation is not counted; after 10 for every program asked for,
        the run ends (as Hypothesis's does, short of failing as unsatisfiable)."""
        one = interrupts.as_findings(self._run_one)
        done = rejected = 0
        while done < examples and rejected < 10 * examples:
            try:
                one()
                done += 1
            except UnsatisfiedAssumption:  # a known violation ends its program, uncounted
                rejected += 1

    def _run_one(self) -> None:
        swarm = self._swarm()
        self.program = []
        state = self.machine()
        try:
            for _ in range(self.steps):
                rule = self._enabled(swarm, state)
                if rule is None:
                    break
                values, printed = {}, {}
                for k, d in rule.arguments.items():
                    values[k], printed[k] = d.draw(self.rng)
                self.program.append((rule.name, printed))
                setattr(state, PRINTED, shown(self.program[-1]))  # for a journal (oracle/journal.py)
                rule.function(state, **values)
        finally:  # as Hypothesis does: the teardown runs however the program ended, and sees
            state.teardown()  # the exception that ended it (a machine's drain check stands down)

    def _swarm(self) -> list[Rule]:
        """Half the programs enable every rule; the rest each rule with probability 1/2."""
        if self.rng.random() < 0.5:
            return self.rules
        return [r for r in self.rules if self.rng.random() < 0.5] or [self.rng.choice(self.rules)]

    def _enabled(self, swarm: Sequence[Rule], state: RuleBasedStateMachine) -> Rule | None:
        ready = [r for r in swarm if stateful.enabled(r, state)]
        return self.rng.choice(ready) if ready else None


SHRINK_TRIES = 3000  # replays one shrink may take
SHRINK_SECONDS = 300.0  # and seconds (Hypothesis's own limit): a replay of a hang takes seconds


def shrink(rules: Sequence[Rule], program: list[Call], fails: Callable[[list[Call]], bool],
           tries: int = SHRINK_TRIES, seconds: float = SHRINK_SECONDS) -> list[Call]:
    """A smaller program of these rules that still `fails`: runs of steps deleted, longest
    first, then each argument made simpler while it still fails, over again until
    neither changes it (or `tries` replays or `seconds` are spent)."""
    left, deadline = [tries], time.monotonic() + seconds

    def still_fails(trial: list[Call]) -> bool:
        if not trial:
            return False
        left[0] -= 1
        return left[0] >= 0 and time.monotonic() < deadline and fails(trial)

    draws = {r.name: r.arguments for r in rules}
    while left[0] > 0 and time.monotonic() < deadline:
        before = program
        program = _simplified(delete_runs(program, still_fails), draws, still_fails)
        if program == before:
            break
    return program


def _simplified(program: list[Call], draws: dict[str, dict[str, Draw]],
                fails: Callable[[list[Call]], bool]) -> list[Call]:
    """Each argument of each step as simple as it gets while the program still fails."""
    for i in range(len(program)):
        for k, draw in draws.get(program[i][0], {}).items():
            simpler = True
            while simpler and k in program[i][1]:
                simpler = False
                for candidate in draw.smaller(program[i][1][k]):
                    trial = [*program[:i], (program[i][0], {**program[i][1], k: candidate}), *program[i + 1 :]]
                    if fails(trial):
                        program, simpler = trial, True
                        break
    return program
