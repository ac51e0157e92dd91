"""SglangAdapter drives SGLang 0.5.5.post3 .. 0.5.23, each API difference gated in its
preamble by the installed release: checked without SGLang."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from kvoracle.oracle.engines import require_release
from kvoracle.oracle.engines.sglang import ASSERTIONS, SglangAdapter, preamble, sglang_release
from preamble_functions import functions_of


def test_the_range_runs_from_0_5_5_post3_to_0_5_23() -> None:
    assert SglangAdapter.releases == ((0, 5, 5, 3), (0, 5, 23))


@pytest.mark.parametrize("installed", [(0, 5, 5, 3), (0, 5, 6), (0, 5, 10, 1), (0, 5, 11), (0, 5, 19), (0, 5, 21),
                                       (0, 5, 22), (0, 5, 23)])
def test_a_release_in_the_range_is_driven(installed: tuple[int, ...]) -> None:
    require_release("sglang", installed, *SglangAdapter.releases, "SglangAdapter")


@pytest.mark.parametrize(("installed", "named"), [((0, 5, 5, 2), "0.5.5.post2"), ((0, 5, 4), "0.5.4"),
                                                  ((0, 5, 24), "0.5.24")])
def test_a_release_outside_the_range_is_refused_as_sglang_names_it(
        installed: tuple[int, ...], named: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVORACLE_NEWER_RELEASES", raising=False)
    with pytest.raises(RuntimeError, match=rf"^sglang {named}: SglangAdapter drives sglang 0\.5\.5\.post3 \.\. 0\.5\.23"):
        require_release("sglang", installed, *SglangAdapter.releases, "SglangAdapter", spell=sglang_release)


def test_the_preamble_compiles_at_any_size() -> None:
    for args in ((), (4, 48), (8, 6, 16, 512)):
        compile(preamble(*args), "<preamble>", "exec")
    compile(ASSERTIONS, "<assertions>", "exec")


def test_every_gate_falls_inside_the_range() -> None:
    low, high = SglangAdapter.releases
    gates = {tuple(int(p) for p in g.split(", ")) for g in re.findall(r"V [<>]=? \(([\d, ]+)\)", preamble())}
    assert gates and all(low < g <= (*high[:2], high[2] + 1) for g in gates), sorted(gates)


def test_importing_the_adapter_imports_no_sglang() -> None:
    code = "import sys, kvoracle.oracle.engines.sglang; print('sglang' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


class OwnFields(SimpleNamespace):  # a request up to 0.5.15: its KV fields are its own (req.kv is the request)
    kv = property(lambda self: self)


@pytest.mark.parametrize(("release", "req"), [
    ((0, 5, 15), OwnFields(kv_committed_len=0, kv_allocated_len=0)),
    ((0, 5, 16), SimpleNamespace(kv_committed_len=0, kv=None)),  # the allocated length: a record made here
    ((0, 5, 18), SimpleNamespace(kv_committed_len=0, kv=None)),
    ((0, 5, 19), SimpleNamespace(kv=SimpleNamespace(kv_committed_len=0, kv_allocated_len=0))),
])
def test_the_kv_a_request_holds_is_written_where_its_release_reads_it(release: tuple[int, ...], req: Any) -> None:
    f = functions_of(preamble(), "kv_fields", "holds", V=release, ReqKvInfo=SimpleNamespace)
    f["holds"](req, 10)
    assert f["kv_fields"](req).kv_committed_len == 10
    assert req.kv.kv_allocated_len == 10  # what release_kv_cache frees up to
