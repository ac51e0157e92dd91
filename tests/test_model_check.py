"""The bounded model check of spec/: the CI scope (storage and re-admission) holds
exhaustively; chunked prefill and decode hold in a smaller scope; FastDeploy's bugs'
mutated specifications are refuted with short traces, under the same IDs the machines
report; the symmetry reduction is sound."""

from collections.abc import Iterator
from dataclasses import replace

import pytest

from kvoracle.proofs.model_check import MUTATIONS, canonical, explore, relabel
from kvoracle.proofs.obligations import CHUNKED_SCOPE, CI_SCOPE, MUTANT_SCOPE
from kvoracle.spec.next import Next, Scope, Step, init
from kvoracle.spec.state import System
from kvoracle.spec.types import GpuBlock, RequestId


def test_ci_scope_holds_exhaustively() -> None:
    assert CI_SCOPE.storage and CI_SCOPE.admissions == 2  # re-admission after preemption, with storage
    report = explore(CI_SCOPE)
    assert report.complete and not report.violation, report.violation
    assert report.states > 100_000  # the scope really is explored, not cut short
    print(f"\n{CI_SCOPE.describe()}: {report.states} states, {report.transitions} transitions, "
          f"{report.rate:.0f} states/s, longest drain {report.longest_drain}")


def test_chunked_prefill_and_decode_hold_exhaustively() -> None:
    assert CHUNKED_SCOPE.chunked and CHUNKED_SCOPE.decode
    report = explore(CHUNKED_SCOPE)
    assert report.passed and report.states > 5_000, report.violation


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
