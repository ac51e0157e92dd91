"""The model checker compiled by mypyc (proofs/compiled.py) is the same search: the same
states, transitions and drains, the same verdicts, the same counterexamples."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoracle.oracle.cli import main
from kvoracle.proofs import compiled
from kvoracle.proofs.model_check import MUTATIONS, Report, explore
from kvoracle.proofs.obligations import MUTANT_SCOPE, QUICK_SCOPE
from kvoracle.proofs.partitioned import explore_partitioned

needs_a_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None or importlib.util.find_spec("mypyc") is None,
    reason="the compiled search needs a C compiler and mypyc (the dev extra)")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("cache")
    # mypy looks for a config in the folders above where it runs: the build must not take
    # a project's (this repository's holds COMPILING false; CI's wheel check caches inside it)
    (cache / "pyproject.toml").write_text('[tool.mypy]\nalways_false = ["COMPILING"]\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVORACLE_CACHE", str(cache))
        yield compiled.build()


def same_search(a: Report, b: Report) -> None:
    assert (a.states, a.transitions, a.longest_drain, a.complete) == (b.states, b.transitions, b.longest_drain,
                                                                      b.complete)
    assert (a.violation, a.trace) == (b.violation, b.trace)


@needs_a_compiler
def test_the_build_compiles_spec_and_the_search(build: Path) -> None:
    built = (build / "BUILT").read_text().split()
    assert "kvoracle/spec/actions.py" in built and "kvoracle/proofs/model_check.py" in built
    assert list((build / "kvoracle" / "spec").glob("actions.*.so"))


@needs_a_compiler
def test_a_second_build_of_the_same_sources_is_the_first(build: Path) -> None:
    assert compiled.build() == build


@needs_a_compiler
def test_the_compiled_search_is_the_interpreted_one(build: Path) -> None:
    seen: list[int] = []
    got = compiled.search(QUICK_SCOPE, progress=lambda states, queued: seen.append(states))
    assert type(got) is Report and got.passed and seen  # the report, and the progress on the way
    same_search(explore(QUICK_SCOPE), got)


@needs_a_compiler
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_compiled_search_refutes_each_mutant_with_the_same_trace(build: Path, mutation: str) -> None:
    got = compiled.search(MUTANT_SCOPE, mutation)
    assert got.violation
    same_search(explore(MUTANT_SCOPE, mutation), got)


@needs_a_compiler
def test_the_compiled_partitioned_search_sends_compiled_states_between_workers(build: Path) -> None:
    same_search(explore_partitioned(QUICK_SCOPE, partitions=2), compiled.search(QUICK_SCOPE, partitions=2))


def test_prove_refuses_compiled_with_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prove", "--compiled", "--ray", "local"]) == 2
    assert "excludes --ray" in capsys.readouterr().err


def test_the_cache_keeps_the_newest_builds(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"build{i}").mkdir()
        marker = tmp_path / f"build{i}" / "BUILT"
        marker.write_text("")
        os.utime(marker, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "unfinished.tmp").mkdir()
    compiled._prune(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build2", "build3", "build4", "unfinished.tmp"]


def _rewritten(module: str) -> dict[str, object]:
    """spec/<module>.py as the build compiles it, run as plain Python."""
    from kvoracle.proofs.native import with_native_methods

    source = with_native_methods((Path(compiled._package()) / "spec" / f"{module}.py").read_text())
    rewritten = types.ModuleType(f"kvoracle.spec.rewritten_{module}")
    with pytest.MonkeyPatch.context() as patch:  # dataclasses reads string annotations' module
        patch.setitem(sys.modules, rewritten.__name__, rewritten)
        exec(compile(source, f"rewritten {module}.py", "exec"), rewritten.__dict__)
    return rewritten.__dict__


def test_the_rewritten_dataclasses_build_equal_and_hash_as_the_frozen_ones() -> None:
    from dataclasses import fields

    from kvoracle.spec import state
    from kvoracle.spec.frozen import replace
    from kvoracle.spec.types import BlockHash

    rewritten = _rewritten("state")
    cls = rewritten["CacheState"]
    assert isinstance(cls, type)
    assert [f.name for f in fields(cls)] == [f.name for f in fields(state.CacheState)]
    a, b = cls(4, 1, (0, 1, 2, 3), (0,)), cls(4, 1, (0, 1, 2, 3), (0,))
    assert a == b and a.nodes == {} and a.nodes is not b.nodes  # a new dict each
    original = state.initial(4, 1)
    assert repr(a) == repr(original)  # the same defaults
    copied = a.__copy__()
    assert copied == a and copied is not a
    node = rewritten["Node"]
    assert isinstance(node, type)
    assert node(None, 3, refcount=1) != node(None, 3, refcount=2)
    assert hash(node(None, 3, 1)) == hash(state.Node(None, 3, 1))  # type: ignore[arg-type]
    heap = rewritten["Heap"]
    assert isinstance(heap, type)
    assert heap() == heap(frozenset(), frozenset()) and hash(heap()) == hash(state.Heap())
    one = frozenset({BlockHash(1)})
    assert replace(state.Heap(), entries=one) == state.Heap(one)


def test_a_rewritten_module_keeps_its_comments_and_every_class_not_frozen() -> None:
    from kvoracle.proofs.native import with_native_methods

    source = (Path(compiled._package()) / "proofs" / "model_check.py").read_text()
    assert with_native_methods(source) == source  # its dataclasses are not frozen: nothing to rewrite
    spec_next = (Path(compiled._package()) / "spec" / "scheduler.py").read_text()
    out = with_native_methods(spec_next)
    assert "frozen=True" not in out and out.count("def __init__") == spec_next.count("frozen=True")
    assert [line for line in out.splitlines() if "#" in line] == [line for line in spec_next.splitlines()
                                                                 if "#" in line]
