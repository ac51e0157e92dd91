"""The pytest plugin (`pytest --kvoracle-adapter`, kvoracle/pytest_plugin.py) and the
factories of kvoracle.testing, as a new user meets them: the bad-input machine runs as
`kvoracle check` runs it, what the CLI refuses up front is refused up front here too, and
a failure names the engine's program, not Hypothesis's tour of kvoracle's own lines."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

import kvoracle.testing
from kvoracle.oracle.engine import Observation, Op, Scripted

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
sys.path.insert(0, str(EXAMPLES))
from toy_engine import ToyAdapter  # noqa: E402  (docs/examples/toy_engine.py)

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def adapters(name: str) -> str:
    """An adapter file for the plugin (its module name is `name`, one per test: the
    in-process sessions share sys.modules): the toy engine with its evict fixed (so
    that valid input passes), a sloppy variant whose double finish is accepted and puts
    a free block on the free list again, and one whose constructor raises."""
    return f'''
import os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
from toy_engine import ToyAdapter, ToyEngine
from kvoracle.oracle.engine import BadInput

HERE = os.path.dirname(os.path.abspath(__file__))


class FixedEngine(ToyEngine):
    def evict(self, n):
        idle = [b for b, r in self.refs.items() if r == 0][:n]
        for b in idle:
            del self.refs[b]
            self.cached = {{h: c for h, c in self.cached.items() if c != b}}
            self.free_list.append(b)
        return len(idle)


class Fixed(ToyAdapter):
    name = "fixed"
    bad_inputs = frozenset()
    preamble = (f"import sys\\nsys.path.insert(0, {{HERE!r}})\\nfrom {name} import FixedEngine\\n"
                "engine = FixedEngine(blocks=6, block_size=2)\\n")


class Sloppy(Fixed):
    name = "sloppy"
    bad_inputs = frozenset({{BadInput.DOUBLE_FINISH}})

    def bad_input(self, kind, rid):
        if kind is BadInput.DOUBLE_FINISH and rid is not None and rid not in self.engine.tables:
            if self.engine.free_list:
                self.run_bad(f"engine.free_list.append({{self.engine.free_list[0]}})")
                return True
        return False


class Unreachable(Fixed):
    name = "unreachable"

    def __init__(self):
        raise RuntimeError("cannot connect to the engine")


class Stuck(Fixed):
    name = "stuck"

    def __init__(self):
        import time
        time.sleep(120)
'''


def test_an_adapter_with_bad_inputs_gets_the_bad_input_machine_too(pytester: pytest.Pytester) -> None:
    """`kvoracle check` runs the bad-input campaign of an adapter that declares bad
    calls; the plugin used to run only the valid-input machine and pass."""
    pytester.makepyfile(plugin_bad=adapters("plugin_bad"))
    result = pytester.runpytest_inprocess("--kvoracle-adapter", "plugin_bad.py:Sloppy", "--kvoracle-examples", "50",
                                          "--kvoracle-steps", "30", "-rA", *QUIET)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["PASSED *kvoracle[[]plugin_bad.py:Sloppy[]]",
                                 "FAILED *kvoracle[[]plugin_bad.py:Sloppy +bad input[]]*"])
    assert "INV-CONSERVE" in result.stdout.str()
    # no bad calls declared: no second test
    result = pytester.runpytest_inprocess("--kvoracle-adapter", "plugin_bad.py:Fixed", "--kvoracle-examples", "10",
                                          "--kvoracle-steps", "20", *QUIET)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("isolated", [False, True])
def test_an_adapter_that_cannot_build_its_engine_is_a_usage_error(pytester: pytest.Pytester, isolated: bool) -> None:
    name = f"plugin_build_{int(isolated)}"
    pytester.makepyfile(**{name: adapters(name)})
    result = pytester.runpytest_inprocess("--kvoracle-adapter", f"{name}.py:Unreachable",
                                          *(["--kvoracle-isolated"] if isolated else []), *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*--kvoracle-adapter {name}.py:Unreachable: the unreachable adapter could not "
                                 "build its engine: RuntimeError('cannot connect to the engine')"])


def test_an_isolated_build_that_hangs_is_a_usage_error_not_a_session_that_waits(pytester: pytest.Pytester,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With --kvoracle-isolated the adapter is built in a child watched as `kvoracle check`
    watches it (the step timeout, 1 s here): it waited for ever."""
    from kvoracle.oracle import watchdog

    monkeypatch.setattr(watchdog, "LIMIT", [1.0])
    pytester.makepyfile(plugin_stuck=adapters("plugin_stuck"))
    result = pytester.runpytest_inprocess("--kvoracle-adapter", "plugin_stuck.py:Stuck", "--kvoracle-isolated", *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--kvoracle-adapter plugin_stuck.py:Stuck: the stuck adapter did not build its "
                                 "engine*"])


@pytest.mark.parametrize("flag, value", [("--kvoracle-steps", "0"), ("--kvoracle-examples", "0"),
                                         ("--kvoracle-steps", "-3"), ("--kvoracle-examples", "many")])
def test_a_count_below_one_is_a_usage_error(pytester: pytest.Pytester, flag: str, value: str) -> None:
    toy = f"{EXAMPLES / 'toy_engine.py'}:ToyAdapter"
    result = pytester.runpytest_inprocess("--kvoracle-adapter", toy, flag, value, *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*argument {flag}: *"])


def test_a_failure_shows_no_explanation_pointing_into_kvoracle(pytester: pytest.Pytester) -> None:
    """Hypothesis's explain phase named kvoracle's own lines (engine_machine.py, the
    raise of PropertyViolated) as "always and only run by failing test cases" (seed 1 of
    the toy engine did)."""
    toy = f"{EXAMPLES / 'toy_engine.py'}:ToyAdapter"
    result = pytester.runpytest_inprocess("--kvoracle-adapter", toy, "--kvoracle-seed", "1", *QUIET)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the planted bug, on valid input (and with bad input too)
    out = result.stdout.str()
    assert "INV-NO-UAF" in out and "state.admit(" in out  # the finding and its program, as before
    assert "Explanation" not in out and "always and only run by failing" not in out, out


def test_the_random_generator_draws_the_programs_and_shows_its_shrunk_one(pytester: pytest.Pytester) -> None:
    """`--kvoracle-generator random` draws as `kvoracle check --generator random` does: the
    toy engine's planted bug is found, and the test shows the program the random
    generator drew and shrank (Hypothesis never ran: no `state.` steps)."""
    toy = f"{EXAMPLES / 'toy_engine.py'}:ToyAdapter"
    result = pytester.runpytest_inprocess("--kvoracle-adapter", toy, "--kvoracle-generator", "random", *QUIET)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "INV-NO-UAF" in out and "the program, drawn at random (seed 0) and shrunk:\nadmit(" in out, out
    assert "state.admit(" not in out


@pytest.mark.parametrize("generator", ["hypothesis", "random"])
def test_a_finding_comes_with_its_engine_calls_in_a_file_that_runs_alone(pytester: pytest.Pytester,
                                                                         generator: str) -> None:
    """As `kvoracle check --repro-dir` writes it: the toy's planted bug, its reproduction
    file confirmed standalone; without the option, the failure says how to get one."""
    toy = f"{EXAMPLES / 'toy_engine.py'}:ToyAdapter"
    run = ("--kvoracle-adapter", toy, "--kvoracle-generator", generator, *QUIET)
    hinted = pytester.runpytest_inprocess(*run).stdout.str()
    assert "its engine calls, as a file that runs alone: add --kvoracle-repro-dir DIR" in hinted, hinted
    result = pytester.runpytest_inprocess(*run, "--kvoracle-repro-dir", "repro")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["reproduction: repro/toy_*inv_no_uaf.py (fails standalone with AssertionError: "
                                 "INV-NO-UAF*"])
    assert sorted(p.name for p in (pytester.path / "repro").iterdir()) == [  # one per campaign
        "toy_admit_inv_no_uaf.py", "toy_bad_input_admit_inv_no_uaf.py"], result.stdout.str()


def test_each_of_a_group_of_failures_is_shown() -> None:
    from kvoracle.pytest_plugin import described

    first, second = AssertionError("INV-PIN: one"), AssertionError("LIVE-EXIT: two")
    second.add_note("state.finish(i=0)")
    text = described(ExceptionGroup("Hypothesis found 2 distinct failures.", [first, second]))
    assert text.splitlines()[1:] == ["", "--- failure 1 of 2 ---", "INV-PIN: one", "", "--- failure 2 of 2 ---",
                                     "LIVE-EXIT: two", "state.finish(i=0)"], text


def test_both_draws_at_random_once_hypothesis_passes(pytester: pytest.Pytester) -> None:
    """The default, as `kvoracle check`'s: Hypothesis's programs, then the random
    generator's; each pass builds the engine for each of its programs."""
    pytester.makepyfile(plugin_both=adapters("plugin_both") + '''

class Counting(Fixed):
    name = "counting"

    def __init__(self):
        super().__init__()
        with open(os.path.join(HERE, "builds"), "a") as builds:
            builds.write("x")
''')
    builds = pytester.path / "builds"
    seen = {}
    for generator in ("hypothesis", "random", "both"):
        builds.write_text("")
        result = pytester.runpytest_inprocess("--kvoracle-adapter", "plugin_both.py:Counting", "--kvoracle-examples",
                                              "10", "--kvoracle-steps", "10", "--kvoracle-generator", generator, *QUIET)
        result.assert_outcomes(passed=1)
        seen[generator] = len(builds.read_text())
    assert seen["random"] > 1 and seen["both"] > seen["hypothesis"] > 1, seen


FACTORY_TEST = f"""
import sys
sys.path.insert(0, {str(EXAMPLES)!r})
from hypothesis import settings
import kvoracle.testing
from toy_engine import ToyAdapter

TestToy = kvoracle.testing.engine_machine(ToyAdapter, settings=settings(max_examples=100, deadline=None,
                                                                       database=None)).TestCase
"""


def test_the_factories_leave_out_only_the_explain_phase(pytester: pytest.Pytester) -> None:
    given = settings(max_examples=7, stateful_step_count=9, deadline=None, phases=[Phase.generate, Phase.explain])
    case: Any = kvoracle.testing.engine_machine(ToyAdapter, settings=given).TestCase
    assert case.settings.phases == (Phase.generate,)
    assert (case.settings.max_examples, case.settings.stateful_step_count) == (7, 9)
    default: Any = kvoracle.testing.engine_machine(ToyAdapter).TestCase
    assert Phase.explain not in default.settings.phases and Phase.shrink in default.settings.phases
    assert default.settings.max_examples == settings().max_examples  # the active profile's
    pytester.makepyfile(test_factory=FACTORY_TEST)
    result = pytester.runpytest_inprocess("--hypothesis-seed=1", *QUIET)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "INV-NO-UAF" in out and "Explanation" not in out, out


class Bare(Scripted):
    """admit only: no finish, no observe (a new user's first adapter)."""

    name = "bare"
    block_size = 2
    operations = frozenset({Op.ADMIT, Op.FINISH})
    bad_inputs: frozenset[Any] = frozenset()

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        return 0


class NotAnAdapter:
    def observe(self) -> Observation:
        return Observation(ids=range(1))


def test_the_factories_say_what_an_adapter_lacks_before_any_machine_runs() -> None:
    with pytest.raises(ValueError, match=r"engine_machine: Bare lacks finish, observe of the EngineAdapter Protocol"):
        kvoracle.testing.engine_machine(Bare)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"machine_for: Bare lacks finish, observe"):
        kvoracle.testing.machine_for(Bare)
    with pytest.raises(ValueError, match=re.escape("cache_machine: ToyAdapter implements the EngineAdapter Protocol, "
                                                   "not the TieredAdapter one: use kvoracle.testing.engine_machine")):
        kvoracle.testing.cache_machine(ToyAdapter)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"scheduler_machine: NotAnAdapter lacks "):
        kvoracle.testing.scheduler_machine(NotAnAdapter)  # type: ignore[arg-type]
    # a callable that is not a class is known only once built: left to the machine
    assert kvoracle.testing.engine_machine(lambda: ToyAdapter()).make_adapter is not None


def test_the_plugin_says_what_an_adapter_lacks(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--kvoracle-adapter", f"{Path(__file__).resolve()}:Bare", *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*Bare lacks finish, observe of the EngineAdapter Protocol*"])


def test_the_docs_example_cites_a_heading_that_exists() -> None:
    """A file that cites a section of docs/engines.md by name cites a real heading."""
    headings = {re.sub(r"^#+\s*", "", h).partition(":")[0].strip()
                for h in (ROOT / "docs" / "engines.md").read_text().splitlines() if h.startswith("#")}
    for path in [*(EXAMPLES / "engine_tests").glob("*.py"), ROOT / "README.md"]:
        for cited in re.findall(r'docs/engines\.md[,:]? "([^"]+)"', path.read_text()):
            assert cited in headings, f"{path.name} cites {cited!r}; docs/engines.md has {sorted(headings)}"
