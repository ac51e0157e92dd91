"""REFINEMENT: after each step, the implementation's abstraction is the state the
specification reached by the same step. At the cache level that is the whole
CacheState; at the scheduler level, the cache and the requests (the clock and the
transfers' start times are the checker's own, not the engine's).

The machines (oracle/cache_machine.py, oracle/scheduler_machine.py) and the
reproductions they write (oracle/findings.py) all judge it here.
"""

from __future__ import annotations

from kvoracle.spec.actions import PreconditionError, ready
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import CacheState, System
from kvoracle.spec.types import RequestId


def refines(want: CacheState | System, got: CacheState | System) -> list[Violation]:
    """REFINEMENT: `got` (the engine's abstraction) is `want` (the specification's state)."""
    parts = differences(want, got)
    if not parts:
        return []
    return [Violation("REFINEMENT", "the engine's state differs from the specification's: " + "; ".join(parts))]


def not_a_step(call: str, err: PreconditionError) -> Violation:
    """REFINEMENT: a step the engine reported taking in its call `call` is none of spec's
    (its action's precondition does not hold)."""
    return Violation("REFINEMENT", f"{call}: the engine's {err.action} is no step of spec/: {err.reason}")


def reports_ready(want: CacheState | None, r: RequestId, said: bool, in_flight: int) -> list[Violation]:
    """REFINEMENT of what the engine says of request r: it is ready (nothing still fills
    its table) exactly when spec's `ready` holds on `want`. An engine that counts its
    fills can disagree with its own structures: a fill that delivered nothing and left
    the request waiting for ever shows here, and in no invariant. Without the state (an
    engine that gives no abstraction) one case is still known: with no transfer in
    flight, nothing can be filling r."""
    if want is not None:
        expected = ready(want, r)
    elif in_flight == 0:
        expected = True
    else:
        return []  # without the state, a transfer in flight may be filling r or not
    if said == expected:
        return []
    return [Violation("REFINEMENT", f"the engine says request {r} is {'' if said else 'not '}ready, with "
                                   f"{in_flight} transfers in flight; by the specification it is "
                                   f"{'' if expected else 'not '}ready")]


def _compared(s: CacheState | System) -> object:
    """What REFINEMENT compares of s (of a System, not the checker's clock)."""
    return (type(s), s.cache, s.requests) if isinstance(s, System) else s


def differences(want: CacheState | System, got: CacheState | System) -> list[str]:
    """What REFINEMENT compares that differs, field by field, spec's value first."""
    if _compared(want) == _compared(got):  # the usual case, in one comparison
        return []
    if isinstance(want, System) and isinstance(got, System):
        requests = [f"request {r}: spec {want.requests.get(r)} / implementation {got.requests.get(r)}"
                    for r in sorted(set(want.requests) | set(got.requests))
                    if want.requests.get(r) != got.requests.get(r)]
        return differences(want.cache, got.cache) + requests
    if isinstance(want, CacheState) and isinstance(got, CacheState):
        return [f"{f}: spec {getattr(want, f)!r} / implementation {getattr(got, f)!r}"
                for f in want.__dataclass_fields__ if getattr(want, f) != getattr(got, f)]
    return [f"the engine's abstraction is a {type(got).__name__}, the specification's state a {type(want).__name__}"]
