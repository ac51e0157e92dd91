"""The bounded model check of spec/: the CI scope holds exhaustively; the seed bugs'
mutated models are refuted with short traces; the symmetry reduction is sound."""

from dataclasses import replace

import pytest

from kvoracle.proofs.model_check import MUTATIONS, Model, Scope, canonical, explore, relabel
from kvoracle.proofs.obligations import CI_SCOPE, MUTANT_SCOPE
from kvoracle.spec.types import GpuBlock


def test_ci_scope_holds_exhaustively() -> None:
    report = explore(CI_SCOPE)
    assert report.complete and not report.violation, report.violation
    assert report.states > 20_000  # the scope really is explored, not cut short
    print(f"\n{CI_SCOPE.describe()}: {report.states} states, {report.transitions} transitions, "
          f"{report.rate:.0f} states/s, longest drain {report.longest_drain}")


@pytest.mark.parametrize("mutant", sorted(MUTATIONS))
def test_seed_bug_models_are_refuted(mutant: str) -> None:
    report = explore(MUTANT_SCOPE, mutant)
    assert report.violation, f"mutated model {mutant} survived"
    assert len(report.trace) <= 7
    print(f"\n{mutant}: {report.violation[0]}\n  " + "\n  ".join(report.trace))


def test_canonical_key_ignores_block_names() -> None:
    model = Model(Scope(gpu_blocks=4, cpu_blocks=1, requests=1))
    label, admitted = next(iter(model.successors(model.initial())))
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
