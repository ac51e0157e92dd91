"""The bounded model check of spec/: the CI scope (storage and re-admission) holds
exhaustively; chunked prefill and decode hold in a smaller scope; FastDeploy's bugs'
mutated specifications are refuted with short traces, under the same IDs the machines
report; the symmetry reduction is sound, and so is leaving out of the key what no step reads."""

from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pytest

from kvoracle.proofs import model_check
from kvoracle.proofs.model_check import (
    MUTATIONS,
    admit_violations,
    canonical,
    digest,
    explore,
    relabel,
    state_violations,
    step_violations,
)
from kvoracle.proofs.obligations import CHUNKED_SCOPE, CI_SCOPE, MUTANT_SCOPE, QUICK_SCOPE
from kvoracle.spec import liveness
from kvoracle.spec.next import Next, Scope, Step, init
from kvoracle.spec.state import System
from kvoracle.spec.types import GpuBlock, RequestId
from kvoracle.spec.view import of_system


def test_ci_scope_holds_exhaustively() -> None:
    assert CI_SCOPE.storage and CI_SCOPE.admissions == 2  # re-admission after preemption, with storage
    report = explore(CI_SCOPE)
    assert report.complete and not report.violation, report.violation
    assert report.states > 40_000  # the scope really is explored, not cut short
    print(f"\n{CI_SCOPE.describe()}: {report.states} states, {report.transitions} transitions, "
          f"{report.rate:.0f} states/s, longest drain {report.longest_drain}")


def test_chunked_prefill_and_decode_hold_exhaustively() -> None:
    assert CHUNKED_SCOPE.chunked and CHUNKED_SCOPE.decode
    report = explore(CHUNKED_SCOPE)
    assert report.passed and report.states > 500, report.violation


# The ID each FastDeploy bug is reported with: the same the machines report first (docs/proofs.md).
FIRST_ID = {"heap-drop": "INV-HEAP-SOUND", "write-raise-finish": "LIVE-EXIT", "write-raise-preempt": "LIVE-EXIT"}


@pytest.mark.parametrize("mutant", sorted(MUTATIONS))
def test_fastdeploy_bug_models_are_refuted(mutant: str) -> None:
    report = explore(MUTANT_SCOPE, mutant)
    assert report.violation, f"mutated model {mutant} survived"
    assert report.violation[0].id == FIRST_ID[mutant]
    assert len(report.trace) <= 6
    print(f"\n{mutant}: {report.violation[0]}\n  " + "\n  ".join(report.trace))


class KeepsASpareBlock(Next):
    """Admission that keeps a block free beyond the one the first decoded token takes (a
    reserve the specification does not allow for): a request that fits waits forever."""

    def _admits(self, s: System, r: RequestId) -> Iterator[Step]:
        if len(s.cache.gpu_free) > len(s.requests[r].tokens) + 1:  # block size 1: a block per token
            yield from super()._admits(s, r)


def test_an_admission_that_starves_is_refuted_by_live_admit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MUTATIONS, "keeps-a-spare-block", KeepsASpareBlock)
    scope = Scope(gpu_blocks=3, cpu_blocks=1, storage=False, requests=1, prompt_blocks=2, admissions=1)
    assert explore(scope).passed  # the request (2 tokens, and 1 decoded) takes the whole pool
    report = explore(scope, "keeps-a-spare-block")
    assert [v.id for v in report.violation] == ["LIVE-ADMIT"] and report.trace == []  # idle from the start


def test_canonical_key_ignores_block_names() -> None:
    scope = Scope(gpu_blocks=4, cpu_blocks=1, requests=1)
    _, admitted = next(iter(Next(scope).steps(init(scope))))
    s = admitted.cache
    swap = {0: 3, 3: 0}
    renamed = replace(
        s,
        gpu_free=tuple(sorted(GpuBlock(swap.get(b, b)) for b in s.gpu_free)),
        requests={r: replace(h, private=tuple(GpuBlock(swap.get(b, b)) for b in h.private)) for r, h in s.requests.items()},
    )
    assert renamed != s
    assert canonical(replace(admitted, cache=renamed)) == canonical(admitted)
    assert relabel(replace(admitted, cache=renamed)) == relabel(admitted)


def test_small_scope_without_storage_holds() -> None:
    report = explore(Scope(gpu_blocks=4, cpu_blocks=1, storage=False, requests=2, admissions=2))
    assert report.passed and report.states > 100


def _every_state(model: Next) -> list[System]:
    """Every state of the scope, one per key: with the key of the moment."""
    first = relabel(init(model.scope))
    seen, queue = {digest(first): first}, [first]
    while queue:
        for _, nxt in model.steps(queue.pop()):
            key, names = model_check._classify(nxt)
            if key not in seen:
                seen[key] = representative = relabel(nxt, names)
                queue.append(representative)
    return list(seen.values())


def _behaviour(model: Next, s: System) -> tuple[object, ...]:
    """All the search sees of s: its verdicts, its drain, and each step's successor (by its
    key) with the step's own verdicts."""
    enabled = list(model.enabled(s))
    view = of_system(s)
    verdicts = state_violations(enabled, s, view) + admit_violations(model, enabled, s, view)
    bound = liveness.drain_bound(model.scope.gpu_blocks, model.scope.cpu_blocks, model.scope.requests)
    after = frozenset((digest(nxt), tuple(v.id for v in step_violations(step, view, of_system(nxt))))
                      for step, nxt in model.steps(s))
    return tuple(v.id for v in verdicts), model_check._drain(s, digest(s), {}, bound), after


readmitted = partial(Scope, prompt_blocks=2, alphabet=2, admissions=2, decode=1, chunked=True)


@pytest.mark.parametrize("scope", [
    QUICK_SCOPE,
    readmitted(gpu_blocks=3, cpu_blocks=1, storage=True, requests=1),
    readmitted(gpu_blocks=3, cpu_blocks=0, storage=False, requests=2),
    readmitted(gpu_blocks=3, cpu_blocks=1, storage=True, requests=2, admissions=1),
    Scope(gpu_blocks=4, cpu_blocks=1, storage=True, requests=3, prompt_blocks=2, alphabet=2, admissions=1),
], ids=["quick", "chunked-readmitted-storage", "chunked-readmitted-two", "chunked-decode-storage-two",
        "storage-three"])
def test_what_the_key_leaves_out_changes_no_step_and_no_verdict(scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    """States that differ only where the key does not look (what `model_check._life` leaves
    out of a request, the stored blocks `model_check._dead` names) behave alike, so
    exploring one of them is enough: every state of the scope with the whole state in its
    key, grouped by the key the search uses, has one behaviour per group."""
    model = Next(scope)
    whole = model_check._life, model_check._dead
    with monkeypatch.context() as m:
        m.setattr(model_check, "_life", lambda r, q: (r, q.status, q.tokens, q.computed, q.admissions))
        m.setattr(model_check, "_dead", lambda requests, block_size: frozenset())
        states = _every_state(model)
    assert (model_check._life, model_check._dead) == whole
    groups: dict[int, list[System]] = {}
    for s in states:
        groups.setdefault(digest(s), []).append(s)
    assert len(groups) < len(states)  # the scope has states it merges
    for members in groups.values():
        assert len({_behaviour(model, s) for s in members}) == 1, [m.requests for m in members]
    assert explore(scope).states == len(groups)
