"""How a checking run reports what it found."""

from __future__ import annotations

import copy
import pickle
import sysconfig
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hypothesis import currently_in_test_context, reject
from hypothesis.errors import UnsatisfiedAssumption

from kvoracle.oracle.interrupts import stops
from kvoracle.spec.invariants import Violation

T = TypeVar("T")


@dataclass
class Baseline:
    """Known violations: `ID` anywhere, or `ID:step` after that step only. A program that
    shows only known violations is counted here and abandoned (the engine's state after a
    violation is not to be trusted); the campaign goes on with the next program."""

    expected: list[tuple[str, str]]  # (ID, step or "")
    seen: Counter[str] = field(default_factory=Counter)  # known ID -> programs that showed it

    @staticmethod
    def parse(specs: Sequence[str]) -> Baseline:
        return Baseline([(s.partition(":")[0], s.partition(":")[2]) for s in specs])

    def known(self, v: Violation, step: str) -> bool:
        return any(v.id == pid and (not where or step == where) for pid, where in self.expected)


class PropertyViolated(AssertionError):
    """A stateful machine found a violation; `.violations` carry the property IDs."""

    # Called with each one raised, once built (a campaign notes when its first catch came,
    # and what it was).
    hooks: list[Callable[[PropertyViolated], None]] = []
    baseline: Baseline | None = None  # the campaign's known violations

    def __init__(self, step: str, violations: Sequence[Violation]) -> None:
        known = PropertyViolated.baseline
        if known is not None and violations and all(known.known(v, step) for v in violations):
            known.seen.update({v.id for v in violations})
            if currently_in_test_context():
                reject()  # a known violation: this program ends here, uncounted
            raise UnsatisfiedAssumption("a known violation")  # the same, outside Hypothesis's engine
        self.step = step
        self.violations = [v for v in violations if known is None or not known.known(v, step)]
        lines = "\n".join(f"  {v}" for v in self.violations[:8])
        more = f"\n  ... and {len(self.violations) - 8} more" if len(self.violations) > 8 else ""
        super().__init__(f"after {step}:\n{lines}{more}")
        for hook in PropertyViolated.hooks:
            hook(self)

    @property
    def first_id(self) -> str:
        return self.violations[0].id

    def __reduce__(self) -> tuple[object, ...]:  # to and from worker processes, notes kept
        return (_rebuilt, (self.step, self.violations, list(getattr(self, "__notes__", []))))


def _rebuilt(step: str, violations: list[Violation], notes: list[str]) -> PropertyViolated:
    hooks, known = PropertyViolated.hooks, PropertyViolated.baseline
    PropertyViolated.hooks, PropertyViolated.baseline = [], None  # a copy, not a new finding
    try:
        e = PropertyViolated(step, violations)
    finally:
        PropertyViolated.hooks, PropertyViolated.baseline = hooks, known
    e.__notes__ = notes
    return e


SHOWN = 1000  # characters of a raised exception a finding quotes


def raised_in(e: BaseException) -> str:
    """Where `e` came from, as " in NAME() (FILE:LINE)": the call into the adapter (the
    first frame of its traceback outside kvoracle's checkers, Hypothesis and the standard
    library; an adapter of oracle/engines/ counts as the adapter), then, where it differs,
    the last such frame, where it was raised; '' where there is none."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not _checker_code(Path(f.filename))]
    if not frames:
        return ""
    entry, last = (f" {f.name}() ({Path(f.filename).name}:{f.lineno})" for f in (frames[0], frames[-1]))
    return f" in{entry}" + ("" if last == entry else f", from{last}")


def _checker_code(path: Path) -> bool:
    """Whether a frame of this file is kvoracle's checking, Hypothesis, the standard
    library, or a replay's evaluation of a printed step: not the adapter's or the engine's."""
    if path.is_relative_to(_PACKAGE):
        return not path.is_relative_to(_PACKAGE / "oracle" / "engines")
    if str(path) == "<string>" or "hypothesis" in path.parts:
        return True
    installed = any(path.is_relative_to(p) for p in _INSTALLED)  # site-packages may lie inside the stdlib's folder
    return not installed and any(path.is_relative_to(p) for p in _STANDARD)


_PACKAGE = Path(__file__).parents[1]  # kvoracle/, as it was imported (links unresolved, as frames name files)
_PATHS = sysconfig.get_paths()
_STANDARD = [Path(_PATHS[k]) for k in ("stdlib", "platstdlib")]
_INSTALLED = [Path(_PATHS[k]) for k in ("purelib", "platlib")]


def abstraction_gone(name: str, method: str) -> Violation:
    """REFINEMENT where the engine's `method` gave None after call `name`, though it gave
    an abstraction when it was built: a record with nothing to refine would judge nothing."""
    return Violation("REFINEMENT", f"after {name} the engine's {method}() gave None, though it gave an "
                                   "abstraction when it was built")


def described(e: BaseException) -> str:
    """repr(e) as a finding quotes it: cut to SHOWN characters (an engine may raise a
    message of megabytes), and whatever its __repr__ does (it may raise)."""
    try:
        text = repr(e)
    except Exception as broken:  # noqa: BLE001 - the engine's exception, not ours
        text = f"<{type(e).__name__}, whose repr raised {type(broken).__name__}>"
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text):,} characters)"


def raised_on_valid_call(call: str, e: BaseException, hint: str = "") -> Violation:
    """VALID-INPUT: an exception escaped the valid call `call` (findings' reproductions
    find the exception's class in this wording: findings._RAISED)."""
    return Violation("VALID-INPUT", f"{call} raised {described(e)} on a valid call{hint}")


def refused(name: str, error: type[Exception], call: Callable[[], bool], snapshot: Callable[[], object],
            made: Callable[[], None]) -> None:
    """A bad call must be refused with `error` and change nothing. `call` makes it and
    returns False when it did not apply (then nothing is checked); `made` runs the
    machine's own counting and checks once it was made."""
    before = kept(snapshot())
    raised: BaseException | None = None
    try:
        called = call()
    except BaseException as e:
        if stops(e):
            raise
        called, raised = True, e
    if not called:
        return
    made()
    found = refusal(error, raised, snapshot() != before)
    if found:
        raise PropertyViolated(name, found)


def kept(seen: T) -> T:
    """What an adapter returned, kept to compare with later: a deep copy, since it may hand
    out its live state and change it in place (the two would then always be equal); the
    object itself where no copy compares equal to it (what compares by identity cannot be
    kept by copying). Copied through pickle first (a third of copy.deepcopy's time on the
    reference's snapshots), then by copy.deepcopy (which shares what it need not copy: a
    NaN stays equal to itself only as the same object)."""
    for copy_of in (_pickled, copy.deepcopy):
        try:
            copied = copy_of(seen)
        except Exception:  # noqa: BLE001 - the adapter's object refuses this way of copying
            continue
        if copied == seen:
            return copied
    return seen


def _pickled(seen: T) -> T:
    copied: T = pickle.loads(pickle.dumps(seen, pickle.HIGHEST_PROTOCOL))
    return copied


def refusal(error: type[Exception], raised: BaseException | None, changed: bool) -> list[Violation]:
    """BAD-INPUT: the bad call raised `error` (or a subclass) and `changed` nothing."""
    if not isinstance(raised, error):
        what = "accepted" if raised is None else f"raised {type(raised).__name__}"
        return [Violation("BAD-INPUT", f"expected {error.__name__}, {what}")]
    if changed:
        return [Violation("BAD-INPUT", f"{error.__name__} raised but the state changed")]
    return []
