"""Running a stateful machine as a campaign: seeded, bounded, with a verdict."""

from __future__ import annotations

import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption
from hypothesis.internal.conjecture import providers
from hypothesis.internal.constants_ast import Constants
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle import interrupts, random_programs, stateful, threads, watchdog
from kvoracle.oracle.engine import BadInput, MalformedObservation
from kvoracle.oracle.isolation import Ended
from kvoracle.oracle.scheduler_machine import _faults
from kvoracle.oracle.step_deletion import delete_runs
from kvoracle.oracle.violations import Baseline, PropertyViolated, described, raised_in
from kvoracle.spec.invariants import Violation
from kvoracle.spec.types import Error, Ok, Partial, Timeout


@dataclass(frozen=True)
class RunResult:
    passed: bool
    violation: PropertyViolated | None
    counterexample: tuple[str, ...]  # the shrunk steps, one call per line, as Hypothesis prints them (replayable)
    seconds: float
    first_catch: int | None = None  # machine steps run when the violation was first seen
    known: dict[str, int] = field(default_factory=dict)  # known violation -> programs that showed it
    ended: Ended | None = None  # the engine ended the campaign's process (oracle.survival)
    # the same steps as people read them, each drawn fault named (`readable`), rendered by
    # the process that drew them: a printer in another process need not draw from the same pool
    shown: tuple[str, ...] = ()

    @property
    def first_id(self) -> str:
        return "" if self.violation is None else self.violation.first_id


def counts(result: RunResult | None, *numbers: int) -> list[str]:
    """A row's tallies as printed: '-' for a campaign whose process ended (they ended with it)."""
    return ["-" if result is not None and result.ended is not None else str(n) for n in numbers]


DEFAULT_GENERATOR = "both"
GENERATOR = [DEFAULT_GENERATOR]  # who draws the programs: "hypothesis", "random" (oracle.random_programs), or "both"
DRAWERS = ("hypothesis", "random")  # the generators that draw programs themselves ("both" runs the two)
GENERATORS = (*DRAWERS, "both")


def set_generator(name: str) -> None:
    if name not in GENERATORS:
        raise ValueError(f"unknown program generator {name!r}: choose one of {', '.join(GENERATORS)}")
    GENERATOR[0] = name


def generators(machine: type[RuleBasedStateMachine], generator: str = "") -> tuple[str, ...]:
    """The generators a campaign's seeds run under, one after the other (`generator`: the
    campaign's by default): "both" is every seed drawn by Hypothesis, then (all passed)
    every seed drawn at random, where the random generator can draw the machine's
    programs. Hypothesis first: what it catches is reported as it always was, and the
    random pass adds only what it misses."""
    generator = generator or GENERATOR[0]
    if generator == "hypothesis":
        return (generator,)
    if not _drawable(machine, "Hypothesis's seeds alone" if generator == "both" else "Hypothesis draws them"):
        return ("hypothesis",)
    return ("hypothesis", "random") if generator == "both" else ("random",)


def _drawable(machine: type[RuleBasedStateMachine], instead: str) -> bool:
    """Whether the random generator can draw the machine's programs; where it cannot,
    stderr says why and what runs `instead`."""
    try:
        random_programs.rules_of(machine, REPLAY_NAMES)
    except random_programs.Unsupported as e:
        print(f"kvoracle: the random generator cannot draw {machine.__name__}'s programs ({e}): {instead}",
              file=sys.stderr)
        return False
    return True


def run_machine(
    machine: type[RuleBasedStateMachine], *, seed_value: int, examples: int, steps: int, shrink: bool = True,
    baseline: Baseline | None = None, generator: str = "", guard: bool = True,
) -> RunResult:
    """Run `examples` random programs of up to `steps` steps from `seed_value`, drawn by
    `generator` ("hypothesis" or "random"; by default the campaign's, Hypothesis for
    "both"); violations the baseline knows end their program without failing the run.
    `guard`: watch each engine call for hangs and tell Ctrl-C from the engine's own
    KeyboardInterrupt (`guarded`); off under a test runner, which has its own timeouts."""
    drawn_by = generator or ("hypothesis" if GENERATOR[0] == "both" else GENERATOR[0])
    programs = _random_programs(machine, seed_value, steps) if drawn_by == "random" else None
    test = _hypothesis_test(machine, seed_value, examples, steps, shrink) if programs is None else (
        lambda: programs.run(examples))
    start = time.perf_counter()
    found: PropertyViolated | None = None
    tally = getattr(machine, "tally", None)
    first: list[int] = []
    caught: list[PropertyViolated] = []  # the first violation, whatever became of its program

    def note_first_catch(e: PropertyViolated) -> None:
        if not first and tally is not None:
            first.append(tally.steps)
        if not caught:
            caught.append(e)

    PropertyViolated.hooks.append(note_first_catch)
    PropertyViolated.baseline = baseline
    with guarded() if guard else nullcontext():  # one run: a hang shortens the limit for its shrinking too
        try:
            with seed_alone():
                test()
        except PropertyViolated as e:
            found = e
        except Flaky as e:  # a failure that did not replay: reported as what it was, never hidden
            found = did_not_replay(e, caught[0] if caught else None)
        except Unsatisfiable:  # every program ended in a known violation before it could count (the build's)
            pass
        except BaseException as e:  # the system under test (or its adapter) raised where no check expected it
            if interrupts.stops(e):
                raise
            found = unexpected(e)
        finally:
            PropertyViolated.hooks.remove(note_first_catch)
        known = dict(baseline.seen) if baseline is not None else {}
        if found is None:
            PropertyViolated.baseline = None
            return RunResult(True, None, (), time.perf_counter() - start, known=known)
        # Outside the except block: teardown skips its drain check while an exception is handled.
        if programs is None:
            steps_found, found = minimize(machine, counterexample_steps(found), found)
        else:
            found, steps_found = shrunk_random(machine, programs, found, shrink)
        PropertyViolated.baseline = None
    return RunResult(False, found, steps_found, time.perf_counter() - start, first[0] if first else None, known,
                     shown=tuple(map(readable, steps_found)))


def _random_programs(machine: type[RuleBasedStateMachine], seed_value: int,
                     steps: int) -> random_programs.Programs | None:
    """The random generator's programs for this machine; None (Hypothesis draws them, and
    stderr says why) where the machine needs Hypothesis's engine."""
    if not _drawable(machine, "Hypothesis draws them"):
        return None
    return random_programs.Programs(machine, seed_value, steps, REPLAY_NAMES)


def _hypothesis_test(machine: type[RuleBasedStateMachine], seed_value: int, examples: int, steps: int,
                     shrink: bool) -> Callable[[], None]:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    config = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    test = seed(seed_value)(get_state_machine_test(machine, settings=config))
    hooks = getattr(test, "hypothesis")  # Hypothesis's documented hook to wrap the program it runs
    hooks.inner_test = interrupts.as_findings(hooks.inner_test)
    return test


def shrunk_random(machine: type[RuleBasedStateMachine], programs: random_programs.Programs,
                  found: PropertyViolated, shrink: bool) -> tuple[PropertyViolated, tuple[str, ...]]:
    """The random generator's failing program, replayed, then shrunk: the finding it
    confirms and its steps, or (it did not fail the same way again) the finding as one
    that did not replay, with no program, as Hypothesis reports a Flaky one."""
    def again(program: list[random_programs.Call]) -> PropertyViolated | None:
        return replay(machine, [random_programs.shown(c) for c in program], preconditions=True)

    if not same_finding(found, again(programs.program), numbers=False):
        return did_not_replay(Flaky("the failing program did not fail the same way when run again"), found), ()
    program = programs.program
    if shrink:
        program = random_programs.shrink(programs.rules, program,
                                         lambda trial: same_finding(found, again(trial), numbers=False))
        found = again(program) or found  # the shrunk program's own report (its step, its message)
    return found, tuple(random_programs.shown(c) for c in program)


@contextmanager
def guarded() -> Iterator[None]:
    """Programs run with every engine call watched for hangs (oracle.watchdog) and
    Ctrl-C told from the engine's own KeyboardInterrupt (oracle.interrupts); the
    machines watch the engine's threads themselves (oracle.threads)."""
    with watchdog.watching(), interrupts.listening():
        yield


@contextmanager
def seed_alone() -> Iterator[None]:
    """Programs drawn from the seed alone. Hypothesis (6.170) now and then (one draw in
    20) draws a constant it read from the source of a loaded local module, one outside
    site-packages: the same seed drew other programs in a checkout, where kvoracle's own
    modules are local, than from the wheel, or in a process that had loaded other
    modules (a test file next to another). Here it sees no local module."""
    local = providers._get_local_constants
    providers._get_local_constants = Constants
    providers.CONSTANTS_CACHE.cache.clear()  # it holds the local constants each range admits
    try:
        yield
    finally:
        providers._get_local_constants = local
        providers.CONSTANTS_CACHE.cache.clear()


# The default campaign: what `kvoracle check` (so `make run`) runs on each target, and
# what tests/test_mutants.py and docs/mutants.md hold every mutant and the reference to.
SEEDS = 5  # seeds per target, from seed 0; a mutant's run stops at its first kill
EXAMPLES = 150  # programs per seed on the cache machine
STEPS = 100  # steps per program, at most


def programs_per_seed(level: str, examples: int) -> int:
    """A scheduler step does more work than a cache step: its machine draws half the programs."""
    return max(1, examples // 2) if level == "scheduler" else examples


def run_seeds(
    machine: type[RuleBasedStateMachine], seeds: Sequence[int], *, examples: int, steps: int,
    baseline: Baseline | None = None,
) -> RunResult:
    """Run seed after seed, under each of the campaign's generators in turn; stop at the
    first seed that finds a violation."""
    if not seeds:
        raise ValueError("no seeds to run")
    for generator in generators(machine):
        for s in seeds:
            result = run_machine(machine, seed_value=s, examples=examples, steps=steps, baseline=baseline,
                                 generator=generator)
            if not result.passed:
                return result
    return result


# The step of a finding that is the adapter's bug, not the engine's: no reproduction is written
MALFORMED = "the program, where the adapter's observation became malformed"


def reproducible(result: RunResult) -> bool:
    """Whether the result is a finding whose engine calls a reproduction can replay (not a
    pass, nor the adapter's malformed observation)."""
    return result.violation is not None and result.violation.step != MALFORMED


def unexpected(e: BaseException) -> PropertyViolated:
    """An exception no check turned into a verdict (from the engine, its adapter, or a
    teardown): a VALID-INPUT finding, with the program Hypothesis shrank it to; an
    observation the adapter made malformed is said to be the adapter's."""
    if isinstance(e, MalformedObservation):
        found = PropertyViolated(MALFORMED, [Violation(
            "VALID-INPUT", f"nothing could be judged: {e}{raised_in(e)} (the adapter's bug, not the engine's)")])
    else:
        found = PropertyViolated(_raised_at(e), [Violation("VALID-INPUT", f"the run raised {described(e)}{raised_in(e)}")])
    found.__notes__ = list(getattr(e, "__notes__", []))
    return found


def _raised_at(e: BaseException) -> str:
    """Where in the program an exception no check caught came: the machine's drain at the
    end, or its last step (a step that raises ends the program, so the shrunk program
    shown ends with the step that raised)."""
    draining = any(frame.f_code.co_name == "teardown" and isinstance(frame.f_locals.get("self"), RuleBasedStateMachine)
                   for frame, _ in traceback.walk_tb(e.__traceback__))
    return "teardown" if draining else "the last step"


def did_not_replay(e: Flaky, first: PropertyViolated | None) -> PropertyViolated:
    """A run whose failing program behaved otherwise when Hypothesis ran it again: the
    violation it saw first (if one was), and why there is no program to show."""
    why = ("the same program behaved otherwise when run again, so it cannot be shrunk or replayed: "
           "the engine or its adapter keeps state from one program to the next (a module-level object, "
           "a shared default argument) or depends on time or randomness")
    if first is None:
        return PropertyViolated("the program", [Violation("VALID-INPUT", f"{why} (Hypothesis: {described(e)})")])
    head = first.violations[0]
    said = Violation(head.id, f"{head.message} [no program: {why} ({type(e).__name__}); this is what the first "
                              "failing program found]")
    return PropertyViolated(first.step, [said, *first.violations[1:]])


_CALL = re.compile(r"^state\.(?!teardown\b)\w+\(.*\)$")


def counterexample_steps(e: BaseException) -> tuple[str, ...]:
    """The rule calls of the shrunk program Hypothesis attached to the failure."""
    notes = getattr(e, "__notes__", [])
    return tuple(line.strip() for note in notes for line in note.splitlines() if _CALL.match(line.strip()))


# The names a printed program's steps use besides `state`: what a replay evaluates them with.
REPLAY_NAMES: dict[str, object] = {"Ok": Ok, "Error": Error, "Partial": Partial, "Timeout": Timeout, "_faults": _faults,
                                   "BadInput": BadInput}
_RULE_NAME = re.compile(r"^state\.(\w+)\(")


def replay(machine: type[RuleBasedStateMachine], steps: Sequence[str],
           more: Mapping[str, object] | None = None, preconditions: bool = False) -> PropertyViolated | None:
    """Run a printed program again on a fresh machine; the violation it ends in, if any.
    `more`: names the steps may use besides Hypothesis's own. `preconditions`: a step
    whose rule's preconditions do not hold there ends the program as no finding (a
    program no generator draws); after the last step every rule's are evaluated, as a
    generator choosing the next step does (one that raises there is a finding)."""
    names = {**REPLAY_NAMES, **(more or {})}
    try:
        with guarded():
            state = machine()
            for step in steps:
                if preconditions and not _enabled(machine, step, state):
                    return None  # no teardown: what it would find belongs to a shorter program
                eval(step, dict(names), {"state": state})  # steps are Hypothesis's own printout
            if preconditions:
                _choosing(machine, state)
            state.teardown()
    except PropertyViolated as e:
        return e
    except (NameError, SyntaxError, UnsatisfiedAssumption):  # not a program this machine can replay,
        return None  # or one that shows only a known violation
    except BaseException as e:  # an unexpected exception replays as the finding it was reported as
        if interrupts.stops(e):
            raise
        return unexpected(e)
    finally:  # a failed program skips its teardown
        watchdog.pause()
        threads.unwatch()
    return None


def _enabled(machine: type[RuleBasedStateMachine], step: str, state: RuleBasedStateMachine) -> bool:
    """Whether the preconditions of the step's rule hold in `state` (an exception one
    raises is the finding, as in a campaign)."""
    found = _RULE_NAME.match(step)
    rule = stateful.rule(machine, found.group(1)) if found else None
    return rule is None or stateful.enabled(rule, state)


def _choosing(machine: type[RuleBasedStateMachine], state: RuleBasedStateMachine) -> None:
    """Every rule's preconditions evaluated in `state`, for what they raise."""
    for rule in stateful.rules(machine).values():
        stateful.enabled(rule, state)


def minimize(machine: type[RuleBasedStateMachine], steps: Sequence[str],
             finding: PropertyViolated) -> tuple[tuple[str, ...], PropertyViolated]:
    """Delete steps while the program still fails with the same finding (Hypothesis's
    stateful shrinker sometimes leaves no-op steps in): the shorter program, and the
    finding as it ran (its call and message: the drain's finish, say, where the program's
    own finish was deleted)."""
    if not steps or not same_finding(finding, replay(machine, steps)):
        return tuple(steps), finding  # not replayable as printed: keep Hypothesis's answer
    latest = finding  # as the last program kept ran: delete_runs ends with the last one it kept

    def fails(trial: list[str]) -> bool:
        nonlocal latest
        again = replay(machine, trial)
        if again is None or not same_finding(finding, again):
            return False
        latest = again
        return True

    shorter = delete_runs(list(steps), fails)
    return (tuple(steps), finding) if len(shorter) == len(steps) else (tuple(shorter), latest)


def same_finding(finding: PropertyViolated, other: PropertyViolated | None, numbers: bool = True) -> bool:
    """`other` is the finding again: the same first ID and, for VALID-INPUT (whatever
    raised), the same call raising the same exception (with `numbers` False, whatever
    numbers its message holds: a shorter program may write fewer blocks). Deleting a
    step can leave one whose precondition no longer holds, and the machine's own code
    may then raise."""
    if other is None or other.first_id != finding.first_id:
        return False
    if finding.first_id != "VALID-INPUT":
        return True
    said, again = finding.violations[0].message, other.violations[0].message
    if not numbers:
        said, again = _NUMBER.sub("#", said), _NUMBER.sub("#", again)
    return other.step == finding.step and said == again


# numbers as messages print them: decimal, 0x-hexadecimal, and a run of 8 or more hexadecimal
# digits (a block hash); not a line number after a file name (two raise sites stay two)
_NUMBER = re.compile(r"(?<!\.py:)\b(?:0x[0-9a-fA-F]+|(?=[0-9a-f]*[0-9])[0-9a-f]{8,}|[0-9]+)\b")


_DRAWN_FAULTS = re.compile(r"_faults\((\d+)\)")


def shown(result: RunResult) -> tuple[str, ...]:
    """The result's program as people read it: as the process that drew it rendered it;
    where that process ended with the engine (its program comes from the journal), as
    this process renders it, so the caller must draw from the campaign's fault pool
    (`cli.use_target_faults`)."""
    return result.shown or tuple(map(readable, result.counterexample))


def readable(step: str) -> str:
    """A printed step with each drawn fault shown as the fault it is."""
    return _DRAWN_FAULTS.sub(lambda m: _shown(_faults(int(m.group(1)))), step.removeprefix("state."))


def _shown(faults: Sequence[Fault]) -> str:
    """The faults a step injects, up to the last real one (later I/O calls succeed)."""
    last = max((i for i, f in enumerate(faults) if f.kind is not FaultKind.OK), default=-1)
    return "[" + ", ".join(str(f) for f in faults[: last + 1]) + "]"
