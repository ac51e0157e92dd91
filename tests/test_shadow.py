"""Shadow mode (kvoracle.shadow) on the toy engine of docs/examples, whose `evict` leaves
the hash map pointing at a block it frees: shadow catches it, with its history, without
changing what the engine does. Also the pytest plugin and KVORACLE_SHADOW."""

from __future__ import annotations

import importlib
import os
import subprocess
import types
import sys
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kvoracle import shadow
from kvoracle.oracle.engine import Observation, scheduler_view
from kvoracle.shadow import Invocation, ObserverBase, ShadowAlarm, attach, restrict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
sys.path.insert(0, str(EXAMPLES))
toy = importlib.import_module("toy_engine")  # docs/examples/toy_engine.py
ToyAdapter: Any = toy.ToyAdapter
ToyEngine: Any = toy.ToyEngine

pytest_plugins = ("pytester",)
OBSERVER = f"{Path(__file__).resolve()}:ToyObserver"


class ToyObserver(ObserverBase):
    """The toy engine as shadow sees it: its adapter's observation (docs/examples), the
    blocks each call changed, and each call as a statement for the reproduction."""

    engine = "toy"
    classes = ("toy_engine:ToyEngine",)

    def __init__(self, engine: object) -> None:
        self.e: Any = cast(Any, engine)
        self.block_size = int(self.e.block_size)
        held = {b for t in self.e.tables.values() for b in t}
        self.blocks = max([*self.e.free_list, *self.e.refs, *held], default=-1) + 1

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("engine", self.e, ("admit", "prefill", "finish", "evict"))]

    def ids(self) -> range:
        return range(self.blocks)

    def observe(self) -> Observation:
        o: Observation = ToyAdapter.observe(SimpleNamespace(engine=self.e))
        return replace(o, ids=self.ids())

    def observe_range(self, ids: range) -> Observation | None:
        return restrict(self.observe(), ids)

    def before(self, call: Invocation) -> object:
        if call.method == "finish":
            return tuple(self.e.tables.get(call.arg(0, "rid"), ()))
        if call.method == "evict":
            return frozenset(self.e.refs)
        return None

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        if call.method in ("admit", "prefill"):
            return tuple(self.e.tables.get(call.arg(0, "rid"), ())) if result else ()
        if call.method == "finish":
            return cast(tuple[int, ...], token)
        return cast(frozenset[int], token) - set(self.e.refs)  # evict: the blocks that left the cache

    def exiting(self, call: Invocation) -> str | None:
        return str(call.arg(0, "rid")) if call.method == "finish" else None

    def table(self, request: str) -> Collection[int]:
        return tuple(self.e.tables.get(request, ()))

    def reproduction(self) -> tuple[str, str] | None:
        return (f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nfrom toy_engine import ToyEngine\n"
                f"engine = ToyEngine(blocks={self.blocks}, block_size={self.block_size})\n", "engine")

    def statement(self, call: Invocation) -> str | None:
        if call.kwargs or not all(isinstance(a, str | int | list) for a in call.args):
            return None
        return f"engine.{call.method}({', '.join(map(repr, call.args))})"


def planted(e: Any) -> None:
    """The calls that bring out the toy's bug: r-c matches the prefix r-a left in the
    hash map, but evict gave its blocks back: block 5 is free, block 4 is r-b's."""
    e.admit("a", [1, 2, 3, 4])
    e.finish("a")
    e.evict(2)
    e.admit("b", [7])
    e.admit("c", [1, 2, 3, 4])


def test_planted_bug_is_caught_with_its_history(tmp_path: Path) -> None:
    e = ToyEngine(blocks=6, block_size=2)
    s = attach(e, engine=ToyObserver, report_dir=tmp_path)
    with pytest.raises(ShadowAlarm) as caught:
        planted(e)
    alarms = caught.value.alarms
    first = alarms[0]
    assert first.id == "INV-NO-UAF" and "block 5" in first.message, first.report()
    assert {a.id for a in alarms} >= {"INV-NO-UAF", "INV-CONSERVE", "INV-REFCOUNT"}
    assert first.check == "incremental"  # found on the changed blocks, confirmed on the full view
    assert 5 in first.blocks
    assert first.after.name == "engine.admit" and "'c'" in first.after.args
    # the story of block 5: admitted for a, released, evicted (still hashed), matched by c
    assert [c.name for c in first.history] == ["engine.admit", "engine.finish", "engine.evict", "engine.admit"]
    assert "'a'" in first.history[0].args and first.history[2].outcome == "-> 2"
    assert "engine.evict(2)" in first.report() and "reproduction:" in first.report()
    assert s.tally.by_id["INV-NO-UAF"] == 1 and s.tally.calls == 5


def test_reproduction_file_replays_the_alarm(tmp_path: Path) -> None:
    e = ToyEngine(blocks=6, block_size=2)
    attach(e, engine=ToyObserver, mode="record", report_dir=tmp_path)
    planted(e)
    path = shadow._attached[id(e)]()
    assert path is not None and path.alarms[0].reproduction is not None
    text = Path(path.alarms[0].reproduction).read_text()
    assert "engine.evict(2)" in text and "engine = ToyEngine(blocks=6, block_size=2)" in text
    done = subprocess.run([sys.executable, path.alarms[0].reproduction], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode != 0 and "ShadowAlarm" in done.stderr and "INV-NO-UAF" in done.stderr, done.stderr[-2000:]
    assert "reproduction:" not in done.stderr and sorted(tmp_path.iterdir()) == [Path(path.alarms[0].reproduction)]


def test_record_mode_goes_on_and_the_engine_does_what_it_did_unshadowed() -> None:
    plain, watched = ToyEngine(blocks=6, block_size=2), ToyEngine(blocks=6, block_size=2)
    s = attach(watched, engine=ToyObserver, mode="record")
    for e in (plain, watched):
        planted(e)
        e.finish("b")
        e.finish("c")
    assert vars(plain) == {k: v for k, v in vars(watched).items() if k not in ("admit", "prefill", "finish", "evict")}
    assert [a.id for a in s.alarms][:1] == ["INV-NO-UAF"] and s.calls == 7
    assert plain.admit("d", [5, 5]) is watched.admit("d", [5, 5]) is True


def test_full_checks_agree_with_incremental_ones() -> None:
    inc, full = ToyEngine(blocks=6, block_size=2), ToyEngine(blocks=6, block_size=2)
    a = attach(inc, engine=ToyObserver, mode="record")
    b = attach(full, engine=ToyObserver, mode="record", incremental=False)
    planted(inc)
    planted(full)
    assert [x.id for x in a.alarms] == [x.id for x in b.alarms]
    assert a.tally.incremental == 5 and b.tally.incremental == 0 and b.tally.full == 5


def test_an_interval_checks_every_nth_call_and_the_audit_catches_up() -> None:
    e = ToyEngine(blocks=6, block_size=2)
    s = attach(e, engine=ToyObserver, mode="record", incremental=False, interval=10)
    planted(e)
    assert s.alarms == [] and s.tally.full == 0
    assert s.audit()[0].id == "INV-NO-UAF" and s.alarms[0].check == "audit"


def leaky_toy() -> Any:
    """A toy engine whose finish forgets the request's private (unhashed) blocks."""
    e = ToyEngine(blocks=6, block_size=2)

    def finish(self: Any, rid: str) -> None:
        for b in self.tables.pop(rid):
            if b in self.refs:
                self.refs[b] -= 1

    e.finish = types.MethodType(finish, e)
    return e


def test_a_lost_block_on_exit_is_live_exit() -> None:
    e = leaky_toy()
    s = attach(e, engine=ToyObserver, mode="record")
    e.admit("a", [1, 2, 3])  # one full block (cached), one partial (private)
    e.finish("a")
    ids = {a.id for a in s.alarms}
    assert "LIVE-EXIT" in ids and "INV-CONSERVE" in ids, [str(a.violation) for a in s.alarms]
    assert any("lost on exit" in a.message for a in s.alarms)


def test_an_exit_that_raises_is_live_exit_and_the_exception_passes_through() -> None:
    e = ToyEngine(blocks=6, block_size=2)
    error = OSError("storage write failed")

    def finish(self: Any, rid: str) -> None:
        raise error  # before the request's blocks go back

    e.finish = types.MethodType(finish, e)
    s = attach(e, engine=ToyObserver)
    e.admit("a", [1, 2, 3])
    with pytest.raises(OSError) as raised:
        e.finish("a")
    assert raised.value is error and "LIVE-EXIT" in "".join(error.__notes__)
    assert s.alarms[0].id == "LIVE-EXIT" and "request a still holds blocks" in s.alarms[0].message


def test_lost_blocks_fail_the_drain_at_the_audit() -> None:
    e = leaky_toy()
    s = attach(e, engine=ToyObserver, mode="record", incremental=False, interval=100)
    e.admit("a", [1, 2, 3])
    e.finish("a")
    assert {a.id for a in s.audit()} >= {"INV-CONSERVE", "LIVE-DRAIN"}


# --- the engine's behaviour is untouched ------------------------------------------------


class Echo:
    """An engine that returns what it is given and raises what it is told to."""

    def __init__(self) -> None:
        self.free_list = [0, 1]

    def give(self, value: object) -> object:
        return value

    def fail(self, error: BaseException) -> None:
        raise error

    def consume(self, items: Iterable[int]) -> list[int]:
        return list(items)

    def outer(self, value: object) -> object:
        return self.give(value)  # a wrapped method calling another: one outermost call


class EchoObserver(ObserverBase):
    engine = "echo"

    def __init__(self, engine: object) -> None:
        self.e: Any = cast(Any, engine)

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("echo", self.e, ("give", "fail", "consume", "outer"))]

    def observe(self) -> Observation:
        return Observation(ids=range(2), free=tuple(self.e.free_list), tables={}, cached=frozenset(),
                           refcounts={})


def test_results_and_exceptions_pass_through_untouched() -> None:
    e = Echo()
    s = attach(e, engine=EchoObserver)
    thing = object()
    assert e.give(thing) is thing and e.outer(thing) is thing
    error = ValueError("the engine's own")
    with pytest.raises(ValueError) as raised:
        e.fail(error)
    assert raised.value is error and not getattr(error, "__notes__", None)
    assert e.consume(x for x in range(3)) == [0, 1, 2]  # summaries never iterate a generator
    assert e.consume(reversed([1, 2])) == [2, 1]
    names = [c.name for c in s.history()]
    assert names == ["echo.give", "echo.outer", "echo.fail", "echo.consume", "echo.consume"]
    assert s.history()[2].outcome.startswith("raised ValueError") and s.alarms == []


def test_an_alarm_is_raised_only_in_raise_mode_and_never_replaces_an_exception() -> None:
    e = Echo()
    s = attach(e, engine=EchoObserver)
    e.free_list.append(1)  # a double free behind the engine's back
    with pytest.raises(ShadowAlarm, match="INV-CONSERVE"):
        e.give(1)
    e.free_list.append(0)
    with pytest.raises(KeyError):  # the engine's exception wins; the alarm waits for a normal return
        e.fail(KeyError("x"))
    with pytest.raises(ShadowAlarm):
        e.give(1)
    assert {a.id for a in s.alarms} == {"INV-CONSERVE"} and any("[0, 1]" in a.message for a in s.alarms)


def test_shadow_own_errors_never_reach_the_engine() -> None:
    class Broken(EchoObserver):
        def observe(self) -> Observation:
            raise RuntimeError("observer bug")

        def ids(self) -> range:
            return range(2)

    e = Echo()
    s = attach(e, engine=Broken)
    assert e.give(3) == 3
    assert s.tally.internal and "observer bug" in s.tally.internal[0]


def test_ring_is_bounded_and_detach_restores_the_methods() -> None:
    e = ToyEngine(blocks=6, block_size=2)
    s = attach(e, engine=ToyObserver, ring=3)
    assert attach(e, engine=ToyObserver) is s  # one shadow per object
    for i in range(5):
        e.admit(f"r{i}", [i])
        e.finish(f"r{i}")
    assert len(s.history()) == 3 and s.history()[-1].seq == 10
    s.detach()
    assert "admit" not in vars(e) and e.admit("x", [1]) is True and s.calls == 10


def test_summaries_are_short_and_never_consume() -> None:
    gen = (x for x in range(3))
    assert shadow.summarise(gen) == "generator"
    assert list(gen) == [0, 1, 2]
    assert shadow.summarise(list(range(100))) == "[0, 1, 2, 3, 4, ... 100 items]"
    assert shadow.summarise({"a": 1}) == "{1 items}"


def test_env_value_is_parsed() -> None:
    assert shadow._parse_env("vllm") == ("vllm", "raise")
    assert shadow._parse_env("sglang,report") == ("sglang", "record")
    assert shadow._parse_env("vllm+vllm-scheduler,report") == ("vllm+vllm-scheduler", "record")
    assert shadow._engines("vllm+vllm-scheduler") == ["vllm", "vllm-scheduler"]
    for bad in ("vllm,loud", "vllm+,report", "+vllm"):
        with pytest.raises(ValueError, match="want ENGINE"):
            shadow._parse_env(bad)


# --- the pytest plugin and the environment variable -----------------------------------


TOY_TESTS = f"""
import sys
sys.path.insert(0, {str(EXAMPLES)!r})
from toy_engine import ToyEngine


def test_the_planted_bug():
    e = ToyEngine(blocks=6, block_size=2)
    e.admit("a", [1, 2, 3, 4]); e.finish("a"); e.evict(2); e.admit("b", [7]); e.admit("c", [1, 2, 3, 4])


def test_fine():
    e = ToyEngine(blocks=6, block_size=2)
    e.admit("a", [1, 2]); e.finish("a")
"""


# -p kvoracle.shadow is imported already here (this file uses it): no assertion rewriting to warn about
PLUGIN = ("-p", "kvoracle.shadow", "--kvoracle-shadow", OBSERVER, "-p", "no:cacheprovider",
          "-W", "ignore::pytest.PytestAssertRewriteWarning")


def test_plugin_attaches_to_every_engine_and_fails_the_session(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_toy=TOY_TESTS)
    result = pytester.runpytest_inprocess(*PLUGIN, "--kvoracle-shadow-dir", str(tmp_path))
    result.assert_outcomes(passed=2)  # the tests themselves pass: the engine ran as ever
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*kvoracle shadow*", "kvoracle shadow (toy): 2 engine object(s), 7 calls, 7 checked*",
                                 "alarms by ID: INV-CONSERVE 2, INV-NO-UAF 1, INV-REFCOUNT 1",
                                 "INV-NO-UAF: request c lists GPU block 5, which is on the free list",
                                 "*/test_toy.py::test_the_planted_bug)", "*engine.evict(2)*", "*reproduction:*"])
    assert not hasattr(ToyEngine.__init__, "__wrapped__")  # the class is as it was after the session


def test_plugin_only_reports_when_asked(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_toy=TOY_TESTS)
    result = pytester.runpytest_inprocess(*PLUGIN, "--kvoracle-shadow-report", "--kvoracle-shadow-dir", str(tmp_path))
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*4 alarm(s)*", "alarms by ID: INV-CONSERVE 2, INV-NO-UAF 1, INV-REFCOUNT 1"])


def test_environment_variable_attaches_in_a_process_we_do_not_write(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(TOY_TESTS + "\ntest_the_planted_bug()\nprint('served')\n")
    env = {**os.environ, shadow.ENV: f"{OBSERVER},report", shadow.ENV_DIR: str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-2000:]
    assert "1 engine object(s), 5 calls" in done.stderr and "INV-NO-UAF" in done.stderr
    env[shadow.ENV] = OBSERVER  # raise mode: the alarm stops the process at the bad call
    done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "ShadowAlarm" in done.stderr and "served" not in done.stdout
    # the uncaught alarm's reports are printed once, with its traceback; the exit summary names them
    raised, _, summary = done.stderr.partition("kvoracle shadow (toy):")
    assert "  history: " in raised and "  history: " not in summary, done.stderr[-3000:]
    assert "INV-NO-UAF after call #5: shown above, with the ShadowAlarm" in summary, summary
    script.write_text(TOY_TESTS + "\ntry:\n    test_the_planted_bug()\nexcept AssertionError:\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    summary = done.stderr.partition("kvoracle shadow (toy):")[2]
    assert "  history: " in summary, done.stderr[-3000:]  # swallowed: reported in full
    assert done.returncode == 1  # and the process fails on it: an alarm in raise mode, whoever caught it


def test_a_module_gets_every_word_after_it_and_a_program_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text("import sys\nprint('argv', sys.argv[1:])\nraise SystemExit(3)\n")
    env = {**os.environ, shadow.ENV: f"{OBSERVER},report", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", "-m", "server", "--port", "8000", "-m", "x"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert "argv ['--port', '8000', '-m', 'x']" in done.stdout, done.stderr[-2000:]
    assert done.returncode == 3 and "kvoracle shadow (toy):" in done.stderr  # the program's own status stands
    for program in (["-m", "no_such_server"], [str(tmp_path / "no_such_server.py")], []):
        done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", *program], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "no_such_server" in done.stderr or "nothing to run" in done.stderr, done.stderr
        assert "kvoracle shadow (toy):" not in done.stderr  # nothing ran: no summary


def test_a_process_fails_when_an_engine_it_was_to_watch_is_not_there(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text("print('served')\n")
    for observers in (f"{Path(__file__).resolve()}:AbsentEngineObserver",
                      f"{OBSERVER}+{Path(__file__).resolve()}:AbsentEngineObserver"):
        done = subprocess.run([sys.executable, "-m", "kvoracle.shadow", str(script)],
                              env={**os.environ, shadow.ENV: observers}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "served" in done.stdout, done.stderr[-2000:]
        assert "not watched: kvoracle_absent_engine.core" in done.stderr



class AbsentEngineObserver(ToyObserver):
    """An observer of an engine this Python does not have."""

    classes = ("kvoracle_absent_engine.core:Cache",)


def test_an_engine_this_python_lacks_is_named_not_passed_in_silence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="def test_fine():\n    pass\n")
    absent = f"{Path(__file__).resolve()}:AbsentEngineObserver"
    result = pytester.runpytest_inprocess("-p", "kvoracle.shadow", "--kvoracle-shadow", absent, "-p",
                                          "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.stdout.fnmatch_lines(["*0 engine object(s)*", "not watched: kvoracle_absent_engine.core (its package, "
                                                          "kvoracle_absent_engine, is not installed in this Python)"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # it checked nothing: a session's setup to mend


class LateObserver(ToyObserver):
    """The toy engine under a top-level module that only the tests put on sys.path."""

    classes = ("late_engine:Engine",)


LATE_TESTS = f"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engines"))  # as a suite finds its engine
from late_engine import Engine


def test_the_planted_bug():
    e = Engine(blocks=6, block_size=2)
    e.admit("a", [1, 2, 3, 4]); e.finish("a"); e.evict(2); e.admit("b", [7]); e.admit("c", [1, 2, 3, 4])
"""


def test_an_engine_the_tests_put_on_sys_path_is_watched_and_not_called_missing(tmp_path: Path) -> None:
    """The observer's class is in a top-level module ("late_engine:Engine") that is not
    importable when the plugin starts: the tests insert its directory. It is watched, and
    the summary must not say its package is missing."""
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "late_engine.py").write_text(
        f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nfrom toy_engine import ToyEngine\n\n\n"
        "class Engine(ToyEngine):\n    pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_late.py").write_text(LATE_TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "kvoracle.shadow",
                           "--kvoracle-shadow", f"{Path(__file__).resolve()}:LateObserver", "--kvoracle-shadow-dir",
                           str(tmp_path / "repro"), "tests"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "1 engine object(s)" in done.stdout and "INV-NO-UAF" in done.stdout, done.stdout[-3000:] + done.stderr
    assert "not watched" not in done.stdout, done.stdout[-3000:]
    assert done.returncode == 1


class MisnamedObserver(ToyObserver):
    """An observer whose engine class is misspelt in a module that is there."""

    classes = ("json:JSONDecodr",)


def test_a_misnamed_engine_class_is_named_and_fails_the_session_that_watched_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nothing="import json\n\ndef test_fine():\n    json.loads('1')\n")
    result = pytester.runpytest_inprocess("-p", "kvoracle.shadow", "--kvoracle-shadow",
                                          f"{Path(__file__).resolve()}:MisnamedObserver", "-p", "no:cacheprovider",
                                          "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.stdout.fnmatch_lines(["*1 passed*"])
    result.stdout.fnmatch_lines(["not watched: json:JSONDecodr (json has no class JSONDecodr)",
                                 "watched nothing: no json:JSONDecodr object was created",
                                 "the session fails: an engine it was to watch is not there*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


class Engine:
    """An engine class given where an observer belongs."""

    def admit(self) -> None:
        pass


def test_a_class_that_is_not_an_observer_is_refused() -> None:
    with pytest.raises(ValueError, match="Engine is not an observer: it has no targets"):
        shadow.observer_class(f"{Path(__file__).resolve()}:Engine")


def test_an_observer_names_the_checks_its_missing_parts_leave_out() -> None:
    class NoExits(ToyObserver):
        exiting = ObserverBase.exiting

    full = shadow.attach(ToyEngine(blocks=6, block_size=2), ToyObserver).summary()
    assert "not checked: LIVE-ADMIT and LIVE-PROGRESS" in full and "LIVE-EXIT" not in full, full
    bare = shadow.attach(ToyEngine(blocks=6, block_size=2), NoExits).summary()
    assert "not checked: LIVE-EXIT (the observer has no exiting()" in bare, bare


def test_an_observation_without_cached_says_leaks_pass() -> None:
    class NoCached(ToyObserver):
        def observe(self) -> Observation:
            return replace(super().observe(), cached=None)

    def leaked(observer: type[ToyObserver]) -> str:
        engine = ToyEngine(blocks=6, block_size=2)
        seen = shadow.attach(engine, observer, mode="record")
        engine.admit("r0", [1, 2, 3])
        engine.tables["r0"].pop()  # its private block leaked: nobody holds it, and it is not cached
        seen.audit()
        return seen.summary()

    blind, seeing = leaked(NoCached), leaked(ToyObserver)
    assert "0 alarm(s)" in blind and "not checked: INV-CONSERVE's and LIVE-EXIT's owner of each used block" in blind
    assert "no `cached` in the GPU observation" in blind, blind
    assert "INV-CONSERVE" in seeing and "`cached`" not in seeing, seeing


def test_not_watched_names_only_a_package_missing_when_the_summary_is_made() -> None:
    tally = shadow.Tally(engines=1, watching=["kvoracle_absent_engine.core", "toy_engine", "json.decoder", "json.decoder"])
    assert tally.unwatched == ["kvoracle_absent_engine.core"]
    assert "not watched: kvoracle_absent_engine.core (its package" in tally.summary()
    assert "toy_engine" not in tally.summary() and "json" not in tally.summary()


class BlindToyObserver(ToyObserver):
    """The toy seen by an observer that cannot say which blocks a call changed."""

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        return None


def test_an_audit_alarm_names_the_call_it_follows_and_unknown_blocks_go_unsaid(tmp_path: Path) -> None:
    """The audit's alarm said `after: #3 audit()` where #3 was engine.evict in its
    history, and every call of an observer that cannot name blocks said `[blocks ?]`."""
    e = leaky_toy()
    s = attach(e, engine=BlindToyObserver, mode="record", interval=100, report_dir=tmp_path)
    e.admit("a", [1, 2, 3])
    e.finish("a")
    e.evict(8)
    drain = next(a for a in s.audit() if a.id == "LIVE-DRAIN")
    report = drain.report()
    assert "  after:   audit(), after call #3 engine.evict(8) -> 1\n" in report, report
    assert [str(c) for c in drain.history] == ["#1 engine.admit('a', [1, 2, 3]) -> True",
                                               "#2 engine.finish('a') -> None", "#3 engine.evict(8) -> 1"]
    assert "#3 audit" not in report and "?" not in report, report
    assert drain.reproduction is not None
    assert "at the audit(), after call #3 engine.evict(8)" in Path(drain.reproduction).read_text()
    # an audit before any call; an observer that can say keeps its blocks in the text
    assert str(shadow.Call(0, "audit", "", "", None, audit=True)) == "audit(), before any call"
    seen = ToyEngine(blocks=6, block_size=2)
    seeing = attach(seen, engine=ToyObserver, mode="record")
    seen.admit("a", [1, 2, 3])
    assert str(seeing.history()[0]) == "#1 engine.admit('a', [1, 2, 3]) -> True  [blocks 4, 5]"


def test_a_misspelt_engine_is_a_usage_error_everywhere(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result = pytester.runpytest_inprocess("-p", "kvoracle.shadow", "--kvoracle-shadow", "vlm", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvoracle-shadow vlm: unknown shadow engine 'vlm': use one of vllm*"])
    script = tmp_path / "serve.py"
    script.write_text("print('served')\n")
    for run in (["-m", "kvoracle.shadow", str(script)], ["-c", "import kvoracle.shadow"]):
        done = subprocess.run([sys.executable, *run], env={**os.environ, shadow.ENV: "vlm"}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "unknown shadow engine 'vlm'" in done.stderr and "served" not in done.stdout


def test_settings_no_shadow_can_use_are_refused() -> None:
    engine = ToyEngine(blocks=6, block_size=2)
    settings: list[tuple[str, object]] = [("interval", 0), ("full_every", -1), ("history", -2), ("ring", 0),
                                          ("gap", -1), ("script_limit", -1), ("interval", 1.5)]
    for setting, value in settings:
        with pytest.raises(ValueError, match=f"{setting} must be an integer of at least"):
            attach(engine, ToyObserver, **cast(dict[str, Any], {setting: value}))
    with pytest.raises(ValueError, match="'report' is mode='record'"):
        attach(engine, ToyObserver, mode="report")  # type: ignore[arg-type]
    assert shadow._calls(0) == "no earlier call" and shadow._calls(1) == "the last call"


def test_an_audit_that_finds_blocks_still_held_says_the_drain_went_unjudged() -> None:
    engine = ToyEngine(blocks=6, block_size=2)
    s = attach(engine, ToyObserver, mode="record")
    engine.admit("leaky", [1, 2, 3])  # never finished
    assert s.audit() == []
    summary = s.summary()
    assert "note: LIVE-DRAIN was not judged at 1 audit(s): something still held blocks there" in summary, summary
    assert "  the audit: still held by leaky" in summary, summary
    engine.finish("leaky")
    s.audit()
    assert "at 1 audit(s)" in s.summary()  # the second audit judged it
    s.detach()


def test_a_second_attach_is_the_same_shadow_raising_if_asked_and_another_engine_is_refused() -> None:
    engine = ToyEngine(blocks=6, block_size=2)
    first = attach(engine, ToyObserver, mode="record")  # as the pytest plugin attaches
    again = attach(engine, ToyObserver)  # a test's own attach, in raise mode
    assert again is first and first.mode == "raise"
    assert attach(engine, ToyObserver, mode="record") is first and first.mode == "raise"  # never made quieter
    with pytest.raises(ValueError, match="already attached with the .*ToyObserver' observer, not 'vllm'"):
        attach(engine, "vllm")
    first.detach()


def test_the_shadow_options_need_no_dash_p(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_toy=TOY_TESTS)
    result = pytester.runpytest_inprocess(*PLUGIN[2:], "--kvoracle-shadow-dir", str(tmp_path))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["kvoracle shadow (toy): 2 engine object(s), 7 calls*"])
    result = pytester.runpytest_inprocess(*PLUGIN, "--kvoracle-shadow-interval", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kvoracle-shadow-interval*want an integer of at least 1, not '0'*"])
    (tmp_path / "file").write_text("")
    result = pytester.runpytest_inprocess(*PLUGIN, "--kvoracle-shadow-dir", str(tmp_path / "file" / "repro"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # said before the session, not at the first alarm
    result.stderr.fnmatch_lines(["*--kvoracle-shadow-dir */file/repro: no folder can be made there*"])


def test_the_plugin_help_names_every_observer_kvoracle_ships(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--help")
    shown = " ".join(result.stdout.lines)
    assert all(name in shown for name in shadow.ENGINES), shown


def test_attaching_to_the_wrong_object_says_what_the_observer_attaches_to() -> None:
    with pytest.raises(TypeError, match="cannot attach to this SimpleNamespace object .* attaches to toy_engine:ToyEngine"):
        attach(SimpleNamespace(), ToyObserver)


# --- a scheduler's steps ------------------------------------------------------------------------


class ToyScheduler:
    """Runs one request of `tokens` tokens on 4 GPU blocks of 2 tokens; `stuck` steps compute nothing."""

    def __init__(self) -> None:
        self.computed: dict[str, int] = {}
        self.stuck = False

    def add(self, rid: str) -> None:
        self.computed[rid] = 0

    def schedule(self) -> None:
        if not self.stuck:
            for rid in self.computed:
                self.computed[rid] += 1

    def finish(self, rid: str) -> None:
        del self.computed[rid]


class ToySchedulerObserver(ObserverBase):
    engine = "toy-scheduler"

    def __init__(self, sched: ToyScheduler) -> None:
        self.sched = sched

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("sched", self.sched, ("add", "schedule", "finish"))]

    def observe(self) -> Observation:
        return Observation(ids=range(0))

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        return frozenset()

    def scheduling(self, call: Invocation) -> bool:
        return call.method == "schedule"

    def keeps_progress(self, call: Invocation) -> bool:
        return call.method == "add"

    def progress(self) -> shadow.Progress:
        live = list(self.sched.computed)
        o = Observation(ids=range(4), free=(3,), waiting=frozenset(), tokens=dict(self.sched.computed))
        return shadow.Progress(scheduler_view(o, None, live, 2), {}, {r: 2 for r in live}, 4, 0)


def test_a_livelock_is_reported_once_per_streak_and_its_record_stays_bounded() -> None:
    sched = ToyScheduler()
    s = attach(sched, ToySchedulerObserver, mode="record")
    sched.add("r0")
    sched.schedule()
    sched.stuck = True
    for _ in range(50):
        sched.schedule()
    assert [a.id for a in s.alarms] == ["LIVE-PROGRESS"] and s.tally.steps == 51
    assert len(s.streak.standstills) == 2  # the grace and the step that broke it: all the next verdict needs
    sched.add("r1")  # a new request keeps the streak going: no second report
    sched.schedule()
    assert len(s.alarms) == 1
    sched.finish("r1")  # an exit from outside starts the count again
    sched.schedule()
    assert len(s.alarms) == 1 and len(s.streak.standstills) == 1
    sched.stuck = False
    sched.schedule()  # r0 computes a token: the streak ends
    sched.stuck = True
    sched.schedule()
    sched.schedule()  # the next streak is reported
    assert [a.id for a in s.alarms] == ["LIVE-PROGRESS", "LIVE-PROGRESS"] and "r0 (2 tokens" in s.alarms[1].message
    with pytest.raises(ShadowAlarm, match="LIVE-PROGRESS: 2 scheduling steps in a row"):
        toy = ToyScheduler()
        attach(toy, ToySchedulerObserver)  # raises by default
        toy.add("q")
        toy.stuck = True
        toy.schedule()
        toy.schedule()
