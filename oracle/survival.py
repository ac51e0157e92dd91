"""A campaign that outlives its engine ending the process (os._exit, a crash in native
code, the OOM killer). The campaign runs in a process of its own (oracle.isolation) with
its machine writing each program to a journal (oracle.journal). When that process ends
without answering, the journal holds the program that ended it: the result is a
VALID-INPUT finding on that program, shrunk by replaying shorter programs, each in a
process of its own, while they still end the process the same way in the same step.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from kvoracle.oracle.campaign import RunResult, replay, run_seeds
from kvoracle.oracle import watchdog
from kvoracle.oracle.engine import Scripted
from kvoracle.oracle.isolation import Ended, in_child
from kvoracle.oracle.journal import TEARDOWN, Journal, journaled, read
from kvoracle.oracle.pulse import Pulse, pulsing
from kvoracle.oracle.step_deletion import delete_runs
from kvoracle.oracle.violations import Baseline, PropertyViolated
from kvoracle.spec.invariants import Violation


GRACE = [60.0]  # seconds past the step timeout a campaign's process may give no sign of life
REPLAY_GRACE = 3.0  # the same for a replay of a program that went silent (the silence was seen once)


def quiet() -> float:
    """How long a campaign's process may give no sign of life (a step journaled, an
    engine call started) before it is killed: the step timeout plus GRACE; 0, never,
    with no step timeout. The watchdog interrupts a hung call in Python; this ends
    one stuck where SIGALRM cannot reach (native code that never returns to Python)."""
    return watchdog.LIMIT[0] + GRACE[0] if watchdog.LIMIT[0] else 0.0


def nothing() -> None:
    """No set-up: a replay's process has what the campaign's had (it is forked)."""


def run_seeds_alone(machine: type[RuleBasedStateMachine], seeds: Sequence[int], *, examples: int, steps: int,
                    baseline: Baseline | None = None, label: str = "") -> tuple[RunResult, Any]:
    """run_seeds in a process of its own: its result and the machine's tally, or (the
    engine ended the process) the finding the journal makes of it and the tally as it was.
    `label` names the campaign in its progress lines (oracle.pulse; default: the machine's name)."""
    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        path = Path(where) / "program"
        work = partial(_campaign, machine, path, seeds, examples, steps, baseline, label or machine.__name__)
        answer = in_child(work, path, quiet())
        if isinstance(answer, Ended):
            return ended_result(machine, read(path), answer), getattr(machine, "tally", None)
        result: tuple[RunResult, Any] = answer
        return result


def on_its_own(machine: type[RuleBasedStateMachine], path: Path, label: str) -> type[RuleBasedStateMachine]:
    """`machine` as a campaign in a process of its own runs it: each program journaled to
    `path` (what is left if the engine ends the process), and its progress shown as `label`."""
    return pulsing(journaled(machine, Journal(path)), Pulse(label))


def _campaign(machine: type[RuleBasedStateMachine], path: Path, seeds: Sequence[int], examples: int, steps: int,
              baseline: Baseline | None, label: str) -> tuple[RunResult, Any]:
    result = run_seeds(on_its_own(machine, path, label), seeds, examples=examples, steps=steps, baseline=baseline)
    return result, getattr(machine, "tally", None)


def alone(machine: type[RuleBasedStateMachine], run: Callable[[type[RuleBasedStateMachine]], None]) -> None:
    """run(machine) in a process of its own, the machine journaling each program (for a
    test runner that must outlive the engine): a failure there is raised here, with the
    child's traceback as a note; an ending is raised here as the VALID-INPUT finding of
    the program that ended it, shrunk, with that program as a note."""
    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        path = Path(where) / "program"
        answer = in_child(partial(_journaled_run, run, machine, path), path, quiet())
        if isinstance(answer, Ended):
            result = ended_result(machine, read(path), answer)
            assert result.violation is not None  # an ending is always a finding
            result.violation.add_note("the program that ended it:\n" + "\n".join(result.counterexample))
            raise result.violation


def _journaled_run(run: Callable[[type[RuleBasedStateMachine]], None], machine: type[RuleBasedStateMachine], path: Path) -> None:
    run(journaled(machine, Journal(path)))


def ended_result(machine: type[RuleBasedStateMachine], lines: Sequence[str] | None, ended: Ended,
                 prepare: Callable[[], None] = nothing) -> RunResult:
    """The finding of a campaign whose process ended, from its journal's `lines` (the
    program it was running; None: no journal came back, from a remote Ray node).
    `prepare` sets up a replay's process as the campaign's was."""
    start = time.perf_counter()
    program = [line for line in lines or () if line != TEARDOWN]
    replayed = shrink(machine, program, lines[-1], ended, prepare) if lines else None
    shrunk = program if replayed is None else replayed
    where = ("(no journal: it ran on a remote node)" if lines is None else
             "while the machine built the engine" if not lines else
             "in the teardown's drain" if lines[-1] == TEARDOWN else f"in step {len(shrunk)}, {_rule(lines[-1])}")
    note = "" if replayed is not None or not lines else "; it did not end the process again when replayed"
    violation = PropertyViolated(_rule(lines[-1]) if lines else "__init__",
                                 [Violation("VALID-INPUT", f"the engine ended the process ({ended}) {where}{note}")])
    return RunResult(False, violation, tuple(shrunk), ended.seconds + time.perf_counter() - start, ended=ended)


def _rule(line: str) -> str:
    return line.removeprefix("state.").partition("(")[0]


def shrink(machine: type[RuleBasedStateMachine], program: Sequence[str], last: str, ended: Ended,
           prepare: Callable[[], None]) -> list[str] | None:
    """The shortest program found, by deleting runs of steps (halving their length),
    whose replay ends the process as `ended` did, with `last` the step it ended in; None
    when `program` itself does not."""
    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        path = Path(where) / "replay"

        def ends_alike(steps: Sequence[str]) -> bool:
            """The replay ends as `ended` did (None: Ray's, which does not say how) in the
            same step: its last, or the teardown. (The replay's journal counts its steps; a
            value Hypothesis drew through a function prints as that value outside a run.)"""
            got = in_child(partial(_replay, machine, steps, path, prepare), path, _replay_quiet(ended))
            ran = read(path)
            where = ran[-1:] == [TEARDOWN] if last == TEARDOWN else len(ran) == len(steps) and ran[-1:] != [TEARDOWN]
            if not isinstance(got, Ended) or bool(got.silent) != bool(ended.silent):
                return False
            return where and (ended.status is None or got.status == ended.status)

        if not ends_alike(program):
            return None
        body, tail = (list(program), []) if last == TEARDOWN else (list(program[:-1]), list(program[-1:]))
        return delete_runs(body, lambda trial: ends_alike(trial + tail), short=0) + tail


def _quiet() -> None:
    """A replay's process writes nothing: what the engine prints as it dies was seen once."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)


def _replay(machine: type[RuleBasedStateMachine], steps: Sequence[str], path: Path, prepare: Callable[[], None]) -> bool:
    _quiet()
    prepare()
    replay(journaled(machine, Journal(path)), steps)
    return True


def ended_script(machine: type[RuleBasedStateMachine], steps: Sequence[str], ended: Ended,
                 prepare: Callable[[], None] = nothing) -> str:
    """The engine calls a Scripted adapter makes replaying `steps` until its process ends,
    as source text ('' when the replay did not end the process)."""
    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        path = Path(where) / "script"
        beat = Path(where) / "program"
        got = in_child(partial(_teed, machine, steps, path, beat, prepare), beat, _replay_quiet(ended))
        return path.read_text(encoding="utf-8") if isinstance(got, Ended) else ""


def _teed(machine: type[RuleBasedStateMachine], steps: Sequence[str], path: Path, beat: Path,
          prepare: Callable[[], None]) -> bool:
    _quiet()
    prepare()
    Scripted.tee = Journal(path)
    replay(journaled(machine, Journal(beat)), steps)
    return True


def _replay_quiet(ended: Ended) -> float:
    """A replay of a program that went silent is killed sooner: the silence was seen once."""
    return watchdog.AFTER_HANG + REPLAY_GRACE if ended.silent else quiet()
