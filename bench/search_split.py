"""Where the model checker's time goes, measured without a profiler (which inflates the
many small calls of spec's actions): every reachable state of a scope is collected
first, then each part of a visit is timed alone over all of them (its share: of the
parts' sum). It prints the search's own states/s beside the parts, and the most
states/s the search could reach if its transitions cost nothing: the per-state view
and evaluation of spec's properties alone.
A benchmark, not a test: no asserts.

    python bench/search_split.py [--scope quick|ci]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvoracle.proofs import model_check  # noqa: E402
from kvoracle.proofs.model_check import admit_violations, explore, no_cycle_collection, relabel, state_violations  # noqa: E402
from kvoracle.proofs.obligations import SCOPES  # noqa: E402
from kvoracle.spec import liveness  # noqa: E402
from kvoracle.spec.invariants import check  # noqa: E402
from kvoracle.spec.next import Next, Scope, Step, init  # noqa: E402
from kvoracle.spec.state import System  # noqa: E402
from kvoracle.spec.view import of_system  # noqa: E402

T = TypeVar("T")


def reachable(model: Next) -> list[System]:
    """Every reachable state's representative, as the search stores them."""
    first = relabel(init(model.scope))
    seen, queue, states = {model_check.digest(first)}, [first], []
    while queue:
        s = queue.pop()
        states.append(s)
        for _, nxt in model_check._successors(model, s, model.enabled(s)):
            key, names = model_check._classify(nxt)
            if key not in seen:
                seen.add(key)
                queue.append(relabel(nxt, names))
    return states


def timed(label: str, states: Sequence[System], part: Callable[[int, System], T], rows: list[tuple[str, float]]) -> list[T]:
    start = time.perf_counter()
    out = [part(i, s) for i, s in enumerate(states)]
    rows.append((label, time.perf_counter() - start))
    return out


def split(scope: Scope) -> None:
    model = Next(scope)
    with no_cycle_collection():
        states = reachable(model)
        rows: list[tuple[str, float]] = []
        enabled: list[list[Step]] = timed("Next's enabled steps", states, lambda i, s: list(model.enabled(s)), rows)
        views = timed("spec's view of the state", states, lambda i, s: of_system(s), rows)
        timed("state properties (invariants, LIVE-TRANSFER, LIVE-EVICT)", states,
              lambda i, s: state_violations(enabled[i], s, views[i]), rows)
        timed("  of which the invariants (spec.invariants.check)", states, lambda i, s: check(views[i]), rows)
        timed("LIVE-ADMIT", states, lambda i, s: admit_violations(model, enabled[i], s, views[i]), rows)
        drains: dict[int, int] = {}
        bound = liveness.drain_bound(scope.gpu_blocks, scope.cpu_blocks, scope.requests)
        timed("LIVE-DRAIN (spec's drain, memoised)", states,
              lambda i, s: model_check._drain(s, model_check.digest(s), drains, bound), rows)
        successors = timed("apply every enabled step", states, lambda i, s: [model.apply(s, e) for e in enabled[i]], rows)
        every = [nxt for out in successors for nxt in out]
        timed("canonical key of every successor", every, lambda i, s: model_check._classify(s), rows)
    start = time.perf_counter()
    report = explore(scope)
    seconds = time.perf_counter() - start
    n, parts = len(states), sum(spent for label, spent in rows if not label.startswith(" "))
    print(f"{scope.describe()}: {n:,} states, {len(every):,} transitions; explore: {seconds:.1f} s, "
          f"{report.states / seconds:,.0f} states/s; its parts, timed alone: {parts:.1f} s")
    print(f"{'part of a visit':<62} {'seconds':>8} {'us/state':>9} {'share':>6}")
    for label, spent in rows:
        print(f"{label:<62} {spent:8.2f} {spent / n * 1e6:9.1f} {spent / parts:6.0%}")
    properties = sum(spent for label, spent in rows if label.startswith(("spec's view", "state properties", "LIVE-")))
    print(f"with transitions free, the per-state view and properties alone allow at most {n / properties:,.0f} "
          "states/s")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scope", choices=("quick", "ci"), default="ci", help="the scope of kvoracle prove (default ci)")
    split(SCOPES[p.parse_args(argv).scope][0])


if __name__ == "__main__":
    main()
