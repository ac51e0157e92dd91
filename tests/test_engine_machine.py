"""The engine adapter Protocol and the generic engine machine, on the reference and on
its mutants: what the machine can see through an adapter is enough to kill them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvoracle.kvcache.manager import CacheManager
from kvoracle.oracle.campaign import run_machine
from kvoracle.kvcache.errors import DoubleFree
from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, check, view_of
from kvoracle.spec.liveness import drained
from kvoracle.oracle.engine_campaign import engine_machine, run_engine
from kvoracle.oracle.cache_machine import prompt
from kvoracle.oracle.engines import ENGINES, EngineUnavailable, adapter_class, load_adapter, require_release
from kvoracle.oracle.engines.reference import ReferenceAdapter
from kvoracle.oracle.mutants import by_name


def adapter_for(cache_class: type[CacheManager]) -> type[ReferenceAdapter]:
    return type(f"Reference_{cache_class.__name__}", (ReferenceAdapter,), {"cache_class": cache_class})


@pytest.mark.parametrize("bad_input", [False, True])
def test_reference_passes_through_its_adapter(bad_input: bool) -> None:
    machine = engine_machine(ReferenceAdapter, bad_input)
    result = run_machine(machine, seed_value=3, examples=150, steps=30)
    assert result.passed, result.violation
    assert machine.tally.steps > 1000 and machine.tally.refused > 0  # memory pressure was reached
    if bad_input:
        assert machine.tally.bad_inputs > 50 and machine.tally.tolerated == 0  # the reference refuses them all


# The mutants whose bug shows through the adapter's observations (one tier, no transfers).
@pytest.mark.parametrize("name, first_id", [
    ("double-free", "INV-CONSERVE"),
    ("double-unlock", "BAD-INPUT"),
    ("counter-drift", "INV-COUNTERS"),
])
def test_engine_machine_kills_mutants_through_the_adapter(name: str, first_id: str) -> None:
    machine = engine_machine(adapter_for(by_name(name).cache_class), bad_input=True)
    result = run_machine(machine, seed_value=1, examples=300, steps=30)
    assert not result.passed and result.first_id == first_id, result.violation


@pytest.mark.parametrize("mutant, bad_input", [("double-free", True), ("counter-drift", False),
                                              ("double-unlock", True)])
def test_reproduction_fails_on_the_mutant_and_passes_on_the_reference(tmp_path: Path, mutant: str,
                                                                      bad_input: bool) -> None:
    """The generated check makes a reproduction fail with the campaign's ID on the engine
    that produced it, and pass once the bug is gone (the same calls on the reference)."""
    m = by_name(mutant)
    row = run_engine(adapter_for(m.cache_class), bad_input, [1, 2, 3], 300, 30, tmp_path)
    assert row.reproduction is not None and row.reproduction.exists(), row.result.violation
    assert row.confirmed, row.reproduces
    text = row.reproduction.read_text()
    assert f"fails_with({row.result.first_id!r}" in text and "kvoracle.oracle.mutants" in text
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text.replace(f"kvoracle.oracle.mutants.{m.cache_class.__qualname__}(",
                                  "kvoracle.kvcache.manager.CacheManager("))
    assert "CacheManager(" in fixed.read_text()
    done = subprocess.run([sys.executable, "-c", f"import kvoracle.kvcache.manager\nexec(open({str(fixed)!r}).read())"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_refused_admission_leaves_no_trace() -> None:
    a = ReferenceAdapter()
    a.admit("r0", prompt(0, a.block_size))  # 3 of 6 blocks
    a.grow("r0", [1, 1])
    a.grow("r0", [1, 1])  # 5 of 6, none evictable
    before = a.observe()
    with pytest.raises(NoRoom):
        a.admit("r1", prompt(3, a.block_size))  # needs 2
    assert a.observe() == before and "r1" not in a.tokens


def test_checks_name_what_is_broken() -> None:
    o = Observation(ids=range(1, 5), free=(1, 1, 2), evictable=(), tables={"a": (2, 3)}, cached=frozenset(),
                    refcounts={3: -1, 2: 1}, counters={"free": (4, 3)})
    ids = {v.id for v in check(o, {"a": 3, "b": 1}, block_size=2)}
    assert ids == {"INV-CONSERVE", "INV-NO-UAF", "INV-REFCOUNT", "INV-COUNTERS", "INV-REQUEST"}
    assert check(Observation(ids=range(1, 3), free=(1, 2), tables={}, cached=frozenset()), {}, 2) == []
    assert [v.id for v in drained(view_of(Observation(ids=range(4), free=(0, 1), evictable=(2,))))] == ["LIVE-DRAIN"]


def test_every_operation_and_bad_input_is_driven() -> None:
    rules: set[str] = set()
    for seed in (5, 6, 7):
        machine = engine_machine(ReferenceAdapter, bad_input=True)
        run_machine(machine, seed_value=seed, examples=100, steps=30)
        rules |= set(machine.tally.per_rule)
    assert {op.value for op in Op} <= rules
    assert {f"bad_input:{b.value}" for b in ReferenceAdapter.bad_inputs} <= rules


def test_unavailable_engine_says_how_to_get_it() -> None:
    missing = [name for name, e in ENGINES.items() if importlib.util.find_spec(e.requires) is None]
    if not missing:
        pytest.skip("every engine is importable here")
    for name in missing:
        e = ENGINES[name]
        with pytest.raises(EngineUnavailable, match=f"its package, {e.requires}, is not installed"):
            adapter_class(name)
    with pytest.raises(KeyError, match="no engine named"):
        adapter_class("nonesuch")


def test_cli_engine_reference_writes_no_reproduction(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvoracle.oracle.cli", "check", "--engine", "reference", "--seeds", "1", "--examples", "20",
         "--steps", "20", "--repro-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reference +bad input" in done.stdout and "0 of 2 campaigns found a violation" in done.stdout
    assert not list(tmp_path.iterdir())


def test_documented_worked_example_is_what_the_command_prints(tmp_path: Path) -> None:
    """docs/engines.md shows the toy engine's first campaign; the command must still print it."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text(encoding="utf-8")
    shown = doc.split("$ kvoracle check --adapter docs/examples/toy_engine.py:ToyAdapter --seeds 1\n")[1]
    shown = shown.split("```")[0].replace("out/repro/", "")
    done = subprocess.run(
        [sys.executable, "-m", "kvoracle.oracle.cli", "check", "--adapter", "docs/examples/toy_engine.py:ToyAdapter",
         "--seeds", "1", "--repro-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 1, done.stderr
    printed = re.sub(r"\s+[0-9.]+s$", "", done.stdout.replace(f"{tmp_path}/", ""), flags=re.M)
    for line in shown.strip().splitlines():
        assert line.rstrip() in printed.splitlines(), f"docs/engines.md shows a line the command no longer prints: {line}"


@pytest.mark.parametrize("args, message", [
    (["--engine", "vllm"], "make engines"),
    (["--adapter", "nonesuch.py:X"], "no file nonesuch.py"),
    (["--adapter", "kvoracle.oracle.engine"], "MODULE:CLASS"),
    (["--adapter", "kvoracle.oracle.engine:Nope"], "has no class Nope"),
    (["--adapter", "kvoracle.oracle.engine:Op"], "lacks"),
    (["--engine", "reference", "--bad-input", "double_unlock"], "cannot make the bad call double_unlock"),
])
def test_engine_cli_errors_are_specific(args: list[str], message: str) -> None:
    if args[:2] == ["--engine", "vllm"] and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_refused_bad_call_stays_in_the_script_without_stopping_it() -> None:
    a = ReferenceAdapter()
    a.admit("r0", prompt(0, a.block_size))
    with pytest.raises(DoubleFree):
        a.bad_input(BadInput.DOUBLE_FREE, None)
    script = a.script()
    assert script[0].startswith("from contextlib import suppress")
    assert script[-1].startswith("with suppress(Exception):  # refused: DoubleFree(")
    exec("\n".join(script), {})  # replays to the end


FRAGILE = '''
from pathlib import Path

from kvoracle.oracle.engines.reference import ReferenceAdapter


class Fragile(ReferenceAdapter):
    """Builds its engine until a file named `broken` lies next to it (a config gone mid-campaign)."""

    def __init__(self) -> None:
        if (Path(__file__).parent / "broken").exists():
            raise RuntimeError("the engine's config is not valid JSON")
        super().__init__()
'''


def test_an_engine_that_stops_building_mid_campaign_is_a_finding_with_a_reproduction(tmp_path: Path) -> None:
    (tmp_path / "fragile.py").write_text(FRAGILE)
    adapter = load_adapter(f"{tmp_path / 'fragile.py'}:Fragile")
    adapter()  # built once, as `kvoracle check` does before its campaigns
    (tmp_path / "broken").touch()
    row = run_engine(adapter, False, [0], 10, 10, tmp_path / "repro")
    assert row.result.first_id == "VALID-INPUT" and row.result.counterexample == ()
    assert "the engine's config is not valid JSON" in str(row.result.violation)
    assert row.reproduction is not None and row.confirmed, row.reproduces
    (tmp_path / "broken").unlink()
    fixed = subprocess.run([sys.executable, str(row.reproduction)], capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr


def test_a_release_outside_an_adapters_range_is_refused_by_name_and_a_newer_one_can_be_tried(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    require_release("vLLM", (0, 33, 0), (0, 30, 0), (0, 34, 0), "VllmAdapter")
    require_release("vLLM", (), (0, 30, 0), (0, 34, 0), "VllmAdapter")  # not installed: the machine says how
    with pytest.raises(RuntimeError, match=r"^vLLM not installed: VllmConnector drives vLLM 0.30.0 .. 0.34.0$"):
        require_release("vLLM", (), (0, 30, 0), (0, 34, 0), "VllmConnector", absent_ok=False)
    with pytest.raises(RuntimeError, match=r"^vLLM 0.25.1: VllmAdapter drives vLLM 0.30.0 .. 0.34.0$"):
        require_release("vLLM", (0, 25, 1), (0, 30, 0), (0, 34, 0), "VllmAdapter")
    monkeypatch.setenv("KVORACLE_NEWER_RELEASES", "1")
    with pytest.raises(RuntimeError):  # an older release stays refused: its APIs are known to differ
        require_release("vLLM", (0, 25, 1), (0, 30, 0), (0, 34, 0), "VllmAdapter")
    monkeypatch.delenv("KVORACLE_NEWER_RELEASES")
    with pytest.raises(RuntimeError, match="vLLM 0.35.0: VllmAdapter drives vLLM 0.30.0 .. 0.34.0; to drive a newer "
                                           "release anyway, set KVORACLE_NEWER_RELEASES=1"):
        require_release("vLLM", (0, 35, 0), (0, 30, 0), (0, 34, 0), "VllmAdapter")
    monkeypatch.setenv("KVORACLE_NEWER_RELEASES", "1")
    capsys.readouterr()
    for _ in range(3):
        require_release("vLLM", (0, 35, 0), (0, 30, 0), (0, 34, 0), "VllmAdapter")
    warned = capsys.readouterr().err
    assert warned.count("vLLM 0.35.0 is newer than VllmAdapter was checked on (0.30.0 .. 0.34.0)") == 1


class Unwritable(adapter_for(by_name("counter-drift").cache_class)):  # type: ignore[misc]
    def script(self) -> list[str]:
        raise RuntimeError("the adapter cannot write its calls")


def test_a_finding_whose_reproduction_cannot_be_written_is_still_reported(tmp_path: Path) -> None:
    row = run_engine(Unwritable, False, [1, 2, 3], 300, 30, tmp_path)
    assert row.result.first_id == "INV-COUNTERS" and not row.confirmed
    assert row.reproduces == "the reproduction could not be written: RuntimeError('the adapter cannot write its calls')"
    assert row.reproduction is not None and "raise SystemExit(" in row.reproduction.read_text()


def test_an_adapter_that_drives_no_eviction_is_drained_by_what_it_calls_evictable() -> None:
    """Without Op.EVICT the drain cannot evict: the cached blocks nobody holds count as
    freed (a correct engine passes: it failed LIVE-DRAIN on every program), and
    the `not checked:` lines say so."""
    from kvoracle.oracle.unchecked import unchecked

    no_evict = type("NoEvict", (ReferenceAdapter,), {"operations": ReferenceAdapter.operations - {Op.EVICT}})
    result = run_machine(engine_machine(no_evict, False), seed_value=0, examples=40, steps=30)
    assert result.passed, result.violation
    assert any(line.startswith("LIVE-DRAIN's eviction: the adapter drives none") for line in unchecked(no_evict()))
    assert not any("LIVE-DRAIN" in line for line in unchecked(ReferenceAdapter()))


def test_a_campaign_whose_engine_never_ran_out_of_room_or_mostly_did_says_why_that_matters() -> None:
    from kvoracle.oracle.unchecked import LEAKS_UNSEEN, refusals_hint

    assert "never ran" in refusals_hint([], 0, 2500, passed=True)  # a full pool's paths: a bug there passes
    assert refusals_hint([], 0, 2500, passed=False) == ""  # a finding says enough
    assert refusals_hint([], 1, 2500, passed=True) == ""
    leaks = [f"INV-CONSERVE: {LEAKS_UNSEEN}"]
    assert "report cached=frozenset()" in refusals_hint(leaks, 1300, 2500, passed=True)
    assert refusals_hint([], 1300, 2500, passed=True) == "" and refusals_hint(leaks, 1000, 2500, passed=True) == ""


def test_the_drain_without_eviction_still_finds_a_block_nobody_can_free() -> None:
    from kvoracle.oracle.engine_machine import evicted

    seen = Observation(ids=range(5), free=(0,), evictable=(1,), tables={}, cached=frozenset({1, 2, 3}),
                       refcounts={1: 0, 2: 0, 3: 1})
    assert evicted(seen).free == (0, 1, 2)  # 2 is 1's parent: free once 1 is evicted
    assert drained(view_of(evicted(seen))) == drained(view_of(Observation(ids=range(5), free=(0, 1, 2))))
    assert drained(view_of(evicted(seen)))  # 3 is still referenced, 4 is lost: neither is freed
    assert evicted(Observation(ids=range(4), free=(0,), evictable=(1,))).free is None  # no `cached`: not judged


def test_run_gives_back_an_expressions_value_or_what_the_statement_bound_to_underscore() -> None:
    from kvoracle.oracle.engine import Scripted

    class Calls(Scripted):
        preamble = "x = 1\n"

    adapter = Calls()
    assert adapter.run("x + 1") == 2
    assert adapter.run("_ = x + 2") == 3
    assert adapter.run("y = 5") is None  # not the 3 a statement before it bound to `_`
    assert adapter.run("_ + 1") == 4  # `_` stays bound for the statements that read it
    assert adapter.script()[1:] == ["x + 1", "_ = x + 2", "y = 5", "_ + 1"]
