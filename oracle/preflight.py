"""An adapter built and looked at once before any campaign drives it (`kvoracle check
--adapter`, the pytest plugin): what is wrong there is the adapter's problem, said as a
usage error (exit status 2), not a finding against its engine, and never a pass.

Whatever the build does is caught here: it raises anything (SystemExit and GeneratorExit
included; only a Ctrl-C stops kvoracle), hangs past the step timeout (the watchdog's
EngineHung), declares sizes no engine can have, or returns no Observation. Built in a
process of its own (`preflight_alone`, as `kvoracle check` does), it may also end that
process, get stuck where no timer reaches, or leave threads running: none of that
reaches the caller, whose process stays as it was.
"""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kvoracle.oracle import interrupts, watchdog
from kvoracle.oracle.engine import MOST_BLOCKS, MalformedObservation, Observation, shaped, size_problem
from kvoracle.oracle.isolation import Ended, in_child
from kvoracle.oracle.unchecked import unchecked

# The sizes an adapter may declare, each an int of at least this (where it declares it).
LEAST_SIZE = {"block_size": 1, "gpu_blocks": 1, "cpu_blocks": 0, "timeout": 1, "reserve": 0}


@dataclass(frozen=True)
class Built:
    """What building an adapter once found."""

    problem: str  # what is wrong with it ('' : nothing), said after "the <name> adapter"
    bad_inputs: bool = False  # whether it declares bad calls
    gaps: tuple[str, ...] = ()  # what its campaign cannot check (oracle.unchecked), a line each


def preflight(adapter: type, watched: bool = True) -> Built:
    """Build `adapter` and look at it, in this process; `watched`: each call within the
    step timeout (`kvoracle check`; under pytest nothing is watched)."""
    with watchdog.watching() if watched else nullcontext(), interrupts.listening():
        try:
            watchdog.kick()
            made = adapter()
        except BaseException as e:
            return Built(_problem("could not build its engine:", "did not build its engine", e))
        try:
            problem = declared_problem(made) or built_problem(made)
        except BaseException as e:  # a size the adapter computes, raising
            return Built(_problem("raised", "did not return", e))
        return Built(problem, bool(getattr(made, "bad_inputs", None)), () if problem else _gaps(adapter, made))


def preflight_alone(adapter: type) -> Built:
    """`preflight` in a child process: an adapter that ends it, or gives no sign of life
    (each call it starts is one) past the step timeout and its grace, is said to have."""
    answer = built_alone(adapter)
    if isinstance(answer, Ended):
        return Built(f"ended its process while it was built and first observed: {answer}")
    return answer


def built_alone(adapter: type) -> Built | Ended:
    """`preflight`, each call within the step timeout, in a child process that is killed
    after the step timeout and its grace without a sign of life; or how that child ended."""
    from kvoracle.oracle.survival import quiet

    with tempfile.TemporaryDirectory(prefix="kvoracle-") as where:
        beat = Path(where) / "beat"
        beat.touch()  # the child is alive from its start: its silence counts from there
        return in_child(partial(_beating, adapter, beat), beat, quiet())


def _beating(adapter: type, beat: Path) -> Built:
    watchdog.beat_with(beat.touch)
    return preflight(adapter)


def _gaps(adapter: type, made: object) -> tuple[str, ...]:
    """What the adapter's campaign cannot check; where asking fails, that it is unknown
    (the campaign, which makes the same calls, will say where)."""
    try:
        watchdog.kick()
        return tuple(unchecked(made))
    except BaseException as e:
        _stop_on_ctrl_c(e)
        return (f"unknown: {adapter.__name__} could not be built and observed alone ({type(e).__name__}: {e}); "
                "the campaign's finding above says where",)


def declared_problem(adapter: object) -> str:
    """The sizes the built adapter declares that no engine can have (a block of 0 tokens,
    a negative pool, a string): a campaign would otherwise blame the engine for them."""
    wrong = []
    for name, least in LEAST_SIZE.items():
        watchdog.kick()
        if problem := size_problem(name, getattr(adapter, name, least), least):
            wrong.append(problem)
    reserve, gpu = getattr(adapter, "reserve", 0), getattr(adapter, "gpu_blocks", None)
    if not wrong and gpu is not None and reserve >= gpu:
        wrong.append(f"reserve ({reserve}) must leave some of its {gpu} GPU blocks to requests")
    return "declares " + "; ".join(wrong) if wrong else ""


def built_problem(adapter: object) -> str:
    """What is wrong with an adapter just built ('' : nothing): its observation must be an
    Observation."""
    try:
        watchdog.kick()
        seen = getattr(adapter, "observe")()
    except BaseException as e:
        return _problem("raised in observe():", "did not return from observe()", e)
    if not isinstance(seen, Observation):
        return f"returned a {type(seen).__name__} from observe(), not an Observation (oracle.engine.Observation)"
    try:
        shaped("GPU", seen, MOST_BLOCKS)
    except MalformedObservation as e:
        return f"returned an observation no property can be judged on: {e}"
    return ""


def _problem(raised: str, hung: str, e: BaseException) -> str:
    """The problem `e` is: `raised` and e, or, where it hung, `hung` (a Ctrl-C is raised
    again: it stops kvoracle)."""
    _stop_on_ctrl_c(e)
    if isinstance(e, watchdog.EngineHung):
        return f"{hung} within the step timeout ({e.seconds:g} s; --step-timeout)"
    return f"{raised} {e!r}"


def _stop_on_ctrl_c(e: BaseException) -> None:
    if isinstance(e, KeyboardInterrupt) and interrupts.stops(e):
        raise e
