"""The command line's answer to bad input: one line on stderr and exit status 2, before
any campaign runs; and its manners (Ctrl-C, a reader that goes away, a CI log)."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvoracle.oracle import cli
from kvoracle.oracle.cli import main
from kvoracle.oracle.engine import size_problem
from kvoracle.oracle.findings import NOT_SCRIPTED
from kvoracle.oracle.workers import each_alone
from kvoracle.proofs import compiled

TOY = "docs/examples/toy_engine.py:ToyAdapter"
TINY = ["--seeds", "1", "--examples", "5"]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `kvoracle` refuses argv with (exit status 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("mutant, level", [("double-free", "cache"), ("write-raise-finish", "scheduler")])
def test_a_mutant_of_another_level_is_refused_naming_its_level(
        mutant: str, level: str, capsys: pytest.CaptureFixture[str]) -> None:
    other = "scheduler" if level == "cache" else "cache"
    err = refused(["check", "--mutant", mutant, "--level", other], capsys)
    assert f"{mutant} is a {level}-level mutant; use --level {level}" in err


def test_progress_of_nothing_to_do_divides_by_nothing() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for out in (Terminal(), io.StringIO()):
        cli.progress(out, 0, 0, "done")


def test_progress_off_a_terminal_is_a_plain_line_per_tenth() -> None:
    out = io.StringIO()  # not a terminal: a CI log
    for done in range(26):
        cli.progress(out, done, 25, f"target {done}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and 10 <= len(lines) <= 11
    assert lines[-1] == "kvoracle: 25/25 done"


@pytest.mark.parametrize("adapter", [["--adapter", TOY], ["--engine", "reference"]])
def test_json_is_written_for_a_request_level_adapter(adapter: list[str], tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert main(["check", *adapter, *TINY, "--json", str(out), "--repro-dir", str(tmp_path / "repro")]) in (0, 1)
    rows = json.loads(out.read_text())
    assert [r["level"] for r in rows] == ["engine", "engine"] and rows[1]["target"].endswith("+bad input")
    assert set(rows[0]) >= {"target", "steps", "faults", "bad_inputs", "verdict", "first_id", "shrunk", "known",
                            "violation", "counterexample"}


def test_known_violations_of_a_request_level_adapter_are_listed(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    expect = [x for pid in ("INV-NO-UAF", "INV-CONSERVE", "INV-REFCOUNT") for x in ("--expect", pid)]
    assert main(["check", "--adapter", TOY, "--seeds", "1", "--examples", "20", *expect,
                 "--repro-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "known: INV-NO-UAF in " in out and "programs of toy (expected with --expect" in out


def test_an_expected_id_that_is_no_id_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["check", "--adapter", TOY, "--expect", "FOO-BAR"], capsys)
    assert "--expect FOO-BAR: no such ID" in err and "INV-NO-UAF" in err and "REFINEMENT" in err
    assert main(["check", "--adapter", TOY, *TINY, "--expect", "VALID-INPUT:admit",  # a step may follow
                 "--repro-dir", str(tmp_path)]) in (0, 1)


def test_prove_without_crosshair_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "crosshair", None)  # find_spec now finds nothing
    err = refused(["prove", "--scope", "quick"], capsys)
    assert "CrossHair is not installed: pip install 'kvoracle[prove]' (crosshair-tool 0.0.113), or run with --no-crosshair" in err


@pytest.mark.parametrize("argv", [
    ["check", "--seeds", "0"], ["check", "--seeds", "-1"], ["check", "--examples", "0"], ["check", "--examples", "-5"],
    ["check", "--steps", "0"], ["check", "--workers", "0"], ["check", "--workers", "-3"],
    ["check", "--record-events", "0"], ["check", "--seeds", "two"],
    ["prove", "--examples", "0"], ["prove", "--workers", "0"], ["prove", "--partitions", "0"],
])
def test_a_count_below_one_is_refused_by_the_parser(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[1]}: " in err and "Traceback" not in err


def test_unwritable_outputs_are_refused_before_the_campaign(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    under_a_file = str(a_file / "sub")
    assert "--repro-dir" in refused(["check", "--repro-dir", under_a_file], capsys)
    assert f"{a_file} is a file, not a directory" in refused(["check", "--json", f"{under_a_file}/x.json"], capsys)
    assert "is a directory" in refused(["check", "--json", str(tmp_path)], capsys)
    assert "--json" in refused(["check", "--adapter", TOY, "--json", f"{under_a_file}/x.json"], capsys)
    assert "--repro-dir" in refused(["check", "--adapter", TOY, "--repro-dir", under_a_file], capsys)
    assert not (tmp_path / "sub").exists()
    if Path("/proc/self").exists():
        assert "--repro-dir /proc/nope" in refused(["check", "--repro-dir", "/proc/nope"], capsys)


def test_ctrl_c_is_one_line_and_status_130(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_mutants", interrupted)
    assert main(["mutants"]) == 130
    assert capsys.readouterr().err.strip() == "kvoracle: interrupted"


def test_ctrl_c_in_a_campaign_keeps_the_finished_rows(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    def then_ctrl_c(*args: Any) -> Any:
        for i, answer in enumerate(each_alone(*args)):
            if i == 1:
                raise KeyboardInterrupt
            yield answer

    monkeypatch.setattr(cli, "each_alone", then_ctrl_c)
    assert main(["check", "--level", "cache", "--no-coverage", *TINY, "--steps", "10"]) == 130
    out = capsys.readouterr().out
    assert "reference" in out and "interrupted: 1 of " in out


@pytest.mark.parametrize("source, says", [
    ("import nonexistent_dep_kvoracle\n", "No module named 'nonexistent_dep_kvoracle'"),
    ("raise RuntimeError('no GPU here')\n", "it raised RuntimeError: no GPU here"),
    ("def broken(:\n", "it raised SyntaxError: "),
])
def test_an_adapter_that_cannot_be_imported_is_named(source: str, says: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"adapter_{abs(hash(source))}.py"
    path.write_text(source)
    err = refused(["check", "--adapter", f"{path}:Engine"], capsys)
    assert err.startswith(f"kvoracle check: --adapter {path}:Engine: cannot import {path}: ") and says in err
    assert path.stem not in sys.modules


def test_an_adapter_module_that_is_missing_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["check", "--adapter", "nonexistent_pkg_kvoracle.bar:Baz"], capsys)
    assert err == ("kvoracle check: --adapter nonexistent_pkg_kvoracle.bar:Baz: cannot import "
                   "nonexistent_pkg_kvoracle.bar: No module named 'nonexistent_pkg_kvoracle'")


def test_a_missing_engine_names_the_releases_its_adapter_drives(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    err = refused(["check", "--engine", "vllm"], capsys)
    assert "--engine vllm: its package, vllm, is not installed in this Python" in err
    assert "pip install 'vllm>=0." in err and "from a kvoracle checkout, `make engines`" in err
    monkeypatch.setitem(sys.modules, "sglang", None)
    assert "pip install 'sglang>=0.5.5.post3,<=" in refused(["check", "--engine", "sglang"], capsys)


def test_option_conflicts_are_refused_before_the_campaign(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(tmp_path / "x.jsonl")
    err = refused(["check", "--mutant", "double-free", "--record-level", "scheduler", "--record", trace], capsys)
    assert "double-free is a cache-level mutant; use --record-level cache" in err
    assert not Path(trace).exists()
    monkeypatch.setitem(sys.modules, "coverage", None)
    err = refused(["check", "--coverage-report", str(tmp_path / "cov.txt")], capsys)
    assert "--coverage-report needs coverage.py: pip install coverage" in err


def test_without_coverage_the_warning_says_how_to_silence_it(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "coverage", None)
    assert cli.coverage_tracker(argparse.Namespace(no_coverage=False)) is None
    assert "--no-coverage" in capsys.readouterr().err


def test_a_small_campaign_whose_mutant_survives_says_it_may_be_too_small(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--mutant", "heap-drop", "--seeds", "1", "--examples", "1", "--steps", "2",
                 "--no-coverage"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "heap-drop SURVIVED" not in last  # the hint is on its own line, after the verdicts
    assert last.startswith("(a campaign smaller than the default --seeds 5 --examples 150 --steps 100")


def test_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and re.fullmatch(r"kvoracle .+, sources [0-9a-f]{16}\n", out), out
    for build, text in (("a", "x = 1\n"), ("b", "x = 2\n")):  # one version, two codes: two digests
        (tmp_path / build / "spec").mkdir(parents=True)
        (tmp_path / build / "spec" / "m.py").write_text(text)
    a, b = (compiled._digest(tmp_path / d, [Path("spec/m.py")]) for d in "ab")
    assert a != b and a == compiled._digest(tmp_path / "a", [Path("spec/m.py")])

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert "not installed" in cli.version()


@pytest.mark.parametrize("argv, code", [(["mutants"], 0), (["check-trace", "docs/examples/heap_drop.jsonl"], 1)])
def test_a_reader_that_goes_away_leaves_the_status_as_it_was(argv: list[str], code: int) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}  # each line written at once
    run = subprocess.Popen([sys.executable, "-m", "kvoracle.oracle.cli", *argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
    assert run.stdout is not None and run.stderr is not None
    run.stdout.readline()
    run.stdout.close()  # `| head -1`
    assert run.wait(timeout=60) == code
    assert run.stderr.read() == b""


def test_hunt_outside_a_checkout_says_where_it_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from kvoracle.oracle import hunt

    monkeypatch.setattr(hunt, "CATALOGUE", tmp_path / "engines" / "hunt.toml")  # as in an installed wheel
    assert main(["hunt", "--list"]) == 2
    err = capsys.readouterr().err
    assert "checkout of kvoracle's repository" in err and "Traceback" not in err


def test_the_pytest_plugin_refuses_an_adapter_it_cannot_load_as_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_own.py").write_text("def test_the_engines_own_test():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvoracle-adapter",
                           "nofile.py:Mine", "test_own.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--kvoracle-adapter nofile.py:Mine: no file nofile.py" in done.stderr


def test_a_program_says_which_of_its_steps_made_the_call_after_which_the_check_fired() -> None:
    from kvoracle.oracle.campaign import RunResult
    from kvoracle.oracle.violations import PropertyViolated
    from kvoracle.spec.invariants import Violation

    def result(call: str) -> RunResult:
        fired = PropertyViolated(call, [Violation("INV-HEAP-SOUND", "node 1 is flagged but has no entry")])
        return RunResult(False, fired, ("state.commit(i=0)", "state.grow(i=0, token=1)"), 0.1)

    assert cli.numbered(result("evict_gpu")) == [
        "  1. commit(i=0)", "  2. grow(i=0, token=1)   (the check fired after its call evict_gpu)"]
    assert cli.numbered(result("grow"))[-1] == "  2. grow(i=0, token=1)"  # the step's own call: nothing to add
    assert cli.numbered(result("drain:finish"))[-2:] == [  # after the program: the drain's own call, not a step's
        "  2. grow(i=0, token=1)", "  then the drain at the end (the check fired there, after its finish)"]
    assert cli.numbered(result("drain"))[-1] == "  then the drain at the end (the check fired there)"
    assert cli.numbered(result("token"))[-1] == "  2. grow(i=0, token=1)"  # named in the step (bad_input's kind)
    assert cli.numbered(result("the program"))[-1] == "  2. grow(i=0, token=1)"  # no call to name


MINIMAL = '''
from kvoracle.oracle.engine import NoRoom, Observation, Op, Scripted
from sibling_engine import Engine


class Minimal(Scripted):
    """admit and finish only: no assertions, no bad inputs, no bad_input method."""
    name = "minimal"
    block_size = 2
    operations = frozenset({Op.ADMIT, Op.FINISH})
    bad_inputs = frozenset()
    preamble = "from sibling_engine import Engine\\nengine = Engine()\\n"

    def bind(self):
        self.engine = self.namespace["engine"]

    def admit(self, rid, tokens):
        if not self.run(f"engine.admit({rid!r}, {len(tokens)})"):
            raise NoRoom(rid)
        return 0

    def finish(self, rid):
        self.run(f"engine.finish({rid!r})")

    def observe(self):
        return Observation(ids=range(8), free=tuple(self.engine.free), tables=dict(self.engine.tables),
                           cached=frozenset())
'''
SIBLING = '''
class Engine:
    """Blocks without a prefix cache: a request's blocks come back at finish."""
    def __init__(self):
        self.free, self.tables = list(range(8)), {}

    def admit(self, rid, tokens):
        need = -(-tokens // 2)
        if need > len(self.free):
            return False
        self.tables[rid], self.free = tuple(self.free[:need]), self.free[need:]
        return True

    def finish(self, rid):
        self.free += self.tables.pop(rid)
'''


@pytest.fixture
def minimal(tmp_path: Path) -> Path:
    """An adapter file that imports an engine module beside it."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "sibling_engine.py").write_text(SIBLING)
    (folder / "minimal_adapter.py").write_text(MINIMAL)
    return folder / "minimal_adapter.py"


def test_an_adapter_needs_neither_assertions_nor_bad_input_and_finds_its_siblings(
        minimal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run from another directory: the adapter's file imports the engine module beside it.
    No bad inputs declared: one campaign, no '+bad input' row. No evict: the drain counts
    what the cache holds idle (here nothing), and a correct engine passes."""
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--adapter", f"{minimal}:Minimal", *TINY, "--repro-dir", str(tmp_path / "repro")]) == 0
    out = capsys.readouterr().out
    assert "minimal: 0 of 1 campaigns found a violation" in out and "+bad input" not in out
    assert "LIVE-DRAIN's eviction: the adapter drives none" in out


def test_a_leak_an_observation_cannot_show_is_said_to_be_unseen(minimal: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An engine without a prefix cache that keeps a block of each finished request: with
    `cached=frozenset()` the leak is INV-CONSERVE; with no `cached` it cannot be told from
    a cached block, and the output says so, and why most admissions were refused."""
    folder = minimal.parent  # modules of names of their own: the process keeps what earlier tests imported
    (folder / "leaky_engine.py").write_text(SIBLING.replace("self.free += self.tables.pop(rid)",
                                                            "self.free += self.tables.pop(rid)[1:]"))
    leaky = MINIMAL.replace("sibling_engine", "leaky_engine")
    (folder / "leaky_adapter.py").write_text(leaky)
    repro = ["--repro-dir", str(tmp_path / "repro")]
    assert main(["check", "--adapter", f"{folder / 'leaky_adapter.py'}:Minimal", *TINY, *repro]) == 1
    out = capsys.readouterr().out
    assert re.search(r"minimal_\w+_inv_conserve\.py \(fails standalone with AssertionError: INV-CONSERVE", out), out
    # the program shrinks to the admission alone: the finish that leaks is the drain's, and the finding says so
    assert "  1. admit(chunks=0, p=0)\n  then the drain at the end (the check fired there, after its finish)" in out
    (folder / "uncached_adapter.py").write_text(leaky.replace("cached=frozenset())", "cached=None)"))
    assert main(["check", "--adapter", f"{folder / 'uncached_adapter.py'}:Minimal", *TINY, *repro]) == 0
    out = capsys.readouterr().out
    assert "not checked: INV-CONSERVE's and LIVE-EXIT's owner of each used block, so a leaked block" in out
    assert re.search(r"note \(minimal\): [\d,]+ of [\d,]+ steps were admissions or growths refused", out), out


PLAIN = '''
from kvoracle.oracle.engine import NoRoom, Observation, Op
from plain_engine import Engine


class Plain:
    """An adapter that calls its engine directly, not through Scripted."""
    name = "plain"
    block_size = 2
    operations = frozenset({Op.ADMIT, Op.FINISH})
    bad_inputs = frozenset()

    def __init__(self):
        self.engine = Engine()

    def admit(self, rid, tokens):
        if not self.engine.admit(rid, len(tokens)):
            raise NoRoom(rid)
        return 0

    def finish(self, rid):
        self.engine.finish(rid)

    def observe(self):
        return Observation(ids=range(8), free=tuple(self.engine.free), tables=dict(self.engine.tables),
                           cached=frozenset())

    def script(self):
        return []
'''


def test_a_finding_of_an_adapter_that_is_not_scripted_says_why_it_has_no_reproduction(
        minimal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Its calls are no text a file can replay: the file written used to hold kvoracle's
    own traceback."""
    folder = minimal.parent
    (folder / "plain_engine.py").write_text(SIBLING.replace("self.free += self.tables.pop(rid)",
                                                            "self.free += self.tables.pop(rid)[1:]"))
    (folder / "plain_adapter.py").write_text(PLAIN)
    plain = f"{folder / 'plain_adapter.py'}:Plain"
    monkeypatch.chdir(tmp_path)  # where out/repro would be
    assert main(["check", "--adapter", plain, *TINY]) == 1
    out = capsys.readouterr().out
    assert "INV-CONSERVE" in out and NOT_SCRIPTED in out.splitlines(), out
    assert not (tmp_path / "out").exists()
    assert refused(["check", "--adapter", plain, "--repro-dir", "r"], capsys).endswith(
        "--repro-dir: the adapter does not derive from oracle.engine.Scripted, so no reproduction is written")


def test_a_method_of_the_protocol_that_is_no_method_is_refused(minimal: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    minimal.write_text(minimal.read_text().replace("    def finish(self, rid):", "    finish = None\n\n    def _finish(self, rid):"))
    err = refused(["check", "--adapter", f"{minimal}:Minimal"], capsys)
    assert "Minimal lacks finish (a NoneType, not a method) of the EngineAdapter Protocol" in err


@pytest.mark.parametrize("spec, says", [
    ("mine/alloc:X", "mine/alloc is neither a file (name it with .py: mine/alloc.py:X) nor a module (dotted: mine.alloc:X)"),
    ("mine/alloc.py::X", "an adapter is named MODULE:CLASS or FILE.py:CLASS (one colon), not 'mine/alloc.py::X'"),
])
def test_an_adapter_named_the_wrong_way_is_told_the_right_way(spec: str, says: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["check", "--adapter", spec], capsys) == f"kvoracle check: --adapter {spec}: {says}"


@pytest.mark.parametrize("stem, whose", [("queue", "Python's own"), ("hypothesis", "an imported")])
def test_an_adapter_file_named_as_a_module_in_use_is_refused(stem: str, whose: str, minimal: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Loaded under its name, it replaced that module for everything imported after it."""
    shadow = minimal.with_name(f"{stem}.py")
    shadow.write_text(minimal.read_text())
    err = refused(["check", "--adapter", f"{shadow}:Minimal"], capsys)
    assert err.endswith(f"would be loaded as the module {stem!r}, the name of {whose} module: rename the file")
    assert sys.modules[stem].__file__ != str(shadow)


def test_reference_only_runs_the_reference_rows_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--reference-only", "--level", "cache", *TINY, "--no-coverage"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if " cache " in line]
    assert rows == ["reference", "reference-small-cpu"]
    assert refused(["check", "--reference-only", "--mutant", "heap-drop"], capsys).endswith(
        "--reference-only excludes --mutant")


def test_a_misspelt_mutant_is_told_the_nearest_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no mutant named 'heap_drop'; did you mean 'heap-drop'? (known: " in refused(
        ["check", "--mutant", "heap_drop"], capsys)
    assert "no mutant named '' (known: " in refused(["check", "--mutant", ""], capsys)  # not the whole campaign
    assert "--mutant" in refused(["check", "--engine", "reference", "--mutant", ""], capsys)


@pytest.mark.parametrize("change, says", [
    ("operations = [Op.ADMIT, Op.FINISH]", "operations must be a frozenset (or set) of Op members"),
    ("operations = frozenset({'admit', 'finish'})", "operations must be a frozenset (or set) of Op members"),
    ("operations = frozenset({Op.ADMIT})", "operations must include Op.FINISH"),
    ("operations = frozenset({Op.ADMIT, Op.FINISH, Op.GROW})", "operations declares Op.GROW but the class has no grow()"),
    ("block_size = 0", "block_size = 0 (an int of at least 1 is needed)"),
    ("bad_inputs = ()", "bad_inputs must be a frozenset (or set) of BadInput members, not ()"),
])
def test_what_an_adapter_declares_is_checked_before_any_campaign(change: str, says: str, minimal: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A mistake in the declarations used to surface as a finding against the engine."""
    key = change.split(" = ")[0]
    text = minimal.read_text()
    start = text.index(f"    {key} = ")
    minimal.write_text(text[:start] + f"    {change}\n" + text[text.index("\n", start) + 1:])
    err = refused(["check", "--adapter", f"{minimal}:Minimal"], capsys)
    assert f"--adapter {minimal}:Minimal: Minimal: {says}" in err


@pytest.mark.parametrize("value, ok", [(16, True), (np.int64(16), True), (1, True), (0, False), (True, False),
                                       (2.0, False), ("16", False), (None, False)])
def test_a_declared_size_is_an_integer_of_at_least_its_least(value: object, ok: bool) -> None:
    """One rule for a size wherever it is checked: the class at load, the built adapter."""
    said = size_problem("block_size", value, 1)
    assert (said == "") is ok and (ok or said == f"block_size = {value!r} (an int of at least 1 is needed)")


def test_an_observation_that_is_not_one_is_refused_before_any_campaign(minimal: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    minimal.write_text(minimal.read_text().replace("return Observation(", "return dict("))
    err = refused(["check", "--adapter", f"{minimal}:Minimal"], capsys)
    assert "the minimal adapter returned a dict from observe(), not an Observation" in err


def test_an_observation_that_turns_malformed_is_the_adapters_bug(minimal: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Its first observation passed the look before the campaign; a later one gives an
    iterator for a collection: the finding says it is the adapter's, and no reproduction
    of engine calls is written."""
    turns = minimal.parent / "turns_adapter.py"
    turns.write_text(MINIMAL.replace("free=tuple(self.engine.free)",
                                     "free=iter(self.engine.free) if self.engine.tables else tuple(self.engine.free)"))
    repro = tmp_path / "repro"
    assert main(["check", "--adapter", f"{turns}:Minimal", *TINY, "--repro-dir", str(repro)]) == 1
    out = capsys.readouterr().out
    assert "after the program, where the adapter's observation became malformed:" in out
    assert "VALID-INPUT: nothing could be judged: the GPU observation's free is a list_iterator" in out
    assert "(the adapter's bug, not the engine's)" in out and "reproduction:" not in out
    assert not list(repro.glob("*.py"))


def test_ctrl_c_in_an_adapters_campaigns_keeps_the_finished_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from kvoracle.oracle import engine_campaign

    campaigns, run_engine = iter([True]), engine_campaign.run_engine

    def then_ctrl_c(*args: Any, **kwargs: Any) -> Any:
        if next(campaigns, False):
            return run_engine(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_campaign, "run_engine", then_ctrl_c)
    assert main(["check", "--adapter", TOY, *TINY, "--repro-dir", str(tmp_path)]) == 130
    out = capsys.readouterr().out
    assert "toy " in out and "interrupted: 1 of 2 campaigns finished" in out


def test_an_expected_step_must_be_one_the_machine_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["check", "--adapter", TOY, "--expect", "INV-CONSERVE:3"], capsys)
    assert "--expect INV-CONSERVE:3: no step '3' at the engine level" in err and "finish" in err
    assert "no step 'bogus'" in refused(["check", "--adapter", TOY, "--expect", "INV-PIN:bogus"], capsys)
    for fine in ("INV-CONSERVE:finish", "INV-CONSERVE:drain:evict", "BAD-INPUT:bad_input:double_finish"):
        assert cli.expect_problem([fine], "engine") == ""
    assert cli.expect_problem(["INV-PIN:evict_gpu"], "cache") == ""  # a call a cache rule makes
    assert cli.expect_problem(["INV-PIN:damage"], "scheduler") == ""  # the disk machine's rule


def test_a_reproduction_that_raises_something_else_confirms_no_valid_input_finding() -> None:
    from kvoracle.oracle.findings import confirms

    finding = "after evict:\n  VALID-INPUT: the run raised TypeError(\"unsupported operand\")"
    assert confirms("AssertionError: VALID-INPUT: the engine raised TypeError('unsupported operand')",
                    "VALID-INPUT", finding)
    assert not confirms("AssertionError: VALID-INPUT: the engine raised ModuleNotFoundError(\"No module named 'x'\")",
                        "VALID-INPUT", finding)
    assert confirms("AssertionError: INV-CONSERVE: GPU block 2 is owned by nobody", "INV-CONSERVE", "INV-CONSERVE: x")


def row(level: str, mutant: object, verdict: str = "") -> Any:
    """A summary row as the hints read it: its target's level and mutant, and its verdict."""
    return SimpleNamespace(target=SimpleNamespace(level=level, mutant=mutant), verdict=verdict)


def test_mutant_rows_on_a_broken_reference_say_the_base_is_broken() -> None:
    """A bug in the reference is in every mutant built on it: their rows (WRONG-ID, a kill
    too soon) are no verdict on the checks, and the summary says to mend the reference."""
    assert cli.broken_reference_hint([]) == ""
    assert cli.broken_reference_hint([row("cache", "double-free")]) == ""  # a mutant's row alone
    said = cli.broken_reference_hint([row("scheduler", None), row("scheduler", "self-preempt")])
    assert "the reference fails at the scheduler level" in said and "mend the reference first" in said


def test_a_bad_mutant_verdict_on_a_passing_reference_blames_the_checks() -> None:
    """SURVIVED or WRONG-ID where the reference of that level passed is the checks' shortfall;
    where it failed, the broken-base hint alone speaks."""
    assert cli.weak_checker_hint([]) == ""
    said = cli.weak_checker_hint([row("cache", "heap-drop", "SURVIVED")])
    assert "SURVIVED: the campaign ran that mutant and no check failed" in said and "WRONG-ID" not in said
    said = cli.weak_checker_hint([row("cache", "heap-drop", "WRONG-ID"), row("scheduler", "x", "SURVIVED")])
    assert "SURVIVED" in said and "WRONG-ID: caught, but first by a property" in said
    assert cli.weak_checker_hint([row("cache", None, "VIOLATION"), row("cache", "heap-drop", "WRONG-ID")]) == ""
    assert cli.weak_checker_hint([row("cache", "heap-drop", "SURVIVED")], small=True) == ""


@pytest.mark.parametrize("argv, named", [
    (["prove", "--partitons", "2"], "(did you mean --partitions?)"),
    (["check", "--exampels", "3"], "(did you mean --examples?)"),
    (["mutants", "extra"], "extra"),
])
def test_a_word_no_option_takes_is_refused_by_its_subcommand(
        argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The subcommand's usage and its nearest option, not the top level's list of subcommands."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and f"usage: kvoracle {argv[0]}" in err
    assert f"kvoracle {argv[0]}: error: unrecognized arguments: " in err and named in err


def test_deep_and_another_scope_are_refused_together(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["prove", "--deep", "--scope", "quick", "--no-crosshair"], capsys)
    assert "--deep is --scope deep: it excludes --scope quick" in err
