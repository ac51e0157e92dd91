"""The pytest plugin: `pytest --kvoracle-adapter MODULE:CLASS` adds a test per adapter
that runs its Protocol's machine (see kvoracle.testing), next to the suite's own tests;
for a request-level adapter that declares bad calls (`bad_inputs`), a second test,
`kvoracle[MODULE:CLASS +bad input]`, runs the machine that makes them too, as
`kvoracle check --adapter` runs both campaigns.

What `kvoracle check` refuses before any campaign is a usage error here too: an adapter
that cannot be loaded, lacks a member of its Protocol, cannot build its engine or
observe it, and a count below 1.

pytest loads it from kvoracle's entry point wherever kvoracle is installed; it adds
options only (shadow mode's too: `--kvoracle-shadow ENGINE` starts kvoracle.shadow's
plugin), and no test unless --kvoracle-adapter is given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kvoracle.oracle.arguments import at_least

if TYPE_CHECKING:  # the plugin loads in every pytest session: Hypothesis only when asked for
    from hypothesis.stateful import RuleBasedStateMachine

    from kvoracle.oracle.campaign import RunResult


def _count(text: str) -> int:
    """A count of at least one, as `kvoracle check` reads it (a usage error otherwise); the
    command line's module loads only when the option is given."""
    from kvoracle.oracle.cli import positive

    return positive(text)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    if not pluginmanager.has_plugin("kvoracle.shadow"):  # `-p kvoracle.shadow` adds them itself
        shadow_options(parser)
    group = parser.getgroup("kvoracle", "kvoracle: check a KV-cache adapter with kvoracle's machines")
    group.addoption("--kvoracle-adapter", action="append", default=[], metavar="MODULE:CLASS",
                    help="run the machine of this adapter's Protocol (MODULE:CLASS or FILE.py:CLASS; repeatable); "
                         "for a request-level adapter with bad_inputs, the bad-input machine too")
    group.addoption("--kvoracle-examples", type=_count, default=100, metavar="N",
                    help="programs per adapter and generator (default 100; under --kvoracle-generator both, "
                         "Hypothesis's, then as many drawn at random)")
    group.addoption("--kvoracle-steps", type=_count, default=50, metavar="N",
                    help="max steps per program (default 50)")
    group.addoption("--kvoracle-seed", type=int, default=0, metavar="N", help="seed of the programs (default 0)")
    group.addoption("--kvoracle-generator", choices=("hypothesis", "random", "both"), default="both",
                    help="who draws the programs, as `kvoracle check --generator` (default both: Hypothesis's, "
                         "then, if they pass, as many drawn by Python's random, which reaches other states)")
    group.addoption("--kvoracle-repro-dir", default=None, metavar="DIR",
                    help="on a finding of a Scripted adapter, write its engine calls to a reproduction file in "
                         "DIR, as `kvoracle check --repro-dir` does (the seed's campaign is run once more to "
                         "find its program); by default the failure says how to get one")
    group.addoption("--kvoracle-isolated", action="store_true",
                    help="run each adapter's machine in a forked process: an engine that ends the process fails "
                         "its test with the program that ended it, and the session goes on (not once CUDA is "
                         "initialised in the session)")


def pytest_configure(config: pytest.Config) -> None:
    """Shadow mode, when --kvoracle-shadow names an engine: the options are known here, so
    `-p kvoracle.shadow` is not needed (kvoracle.shadow loads only then)."""
    if config.getoption("kvoracle_shadow", None) and not config.pluginmanager.has_plugin("kvoracle.shadow"):
        from kvoracle import shadow

        shadow.pytest_configure(config)


def shadow_options(parser: pytest.Parser) -> None:
    """kvoracle.shadow's options: this plugin, which pytest loads wherever kvoracle is
    installed, adds them too, so that they work without `-p kvoracle.shadow`."""
    group = parser.getgroup("kvoracle-shadow", "kvoracle shadow mode: check every engine object the tests create")
    group.addoption("--kvoracle-shadow", metavar="ENGINE", default=None,
                    help="attach to every engine object of ENGINE (vllm, vllm-scheduler, sglang, MODULE:CLASS or "
                         "FILE.py:CLASS of an observer; several joined by +, e.g. vllm+vllm-scheduler)")
    group.addoption("--kvoracle-shadow-report", action="store_true",
                    help="only report alarms: do not fail the session")
    group.addoption("--kvoracle-shadow-history", type=at_least(0), default=10, metavar="N",
                    help="calls shown per alarm (default 10)")
    group.addoption("--kvoracle-shadow-interval", type=at_least(1), default=1, metavar="N",
                    help="without incremental checks, a full check every N calls (default 1)")
    group.addoption("--kvoracle-shadow-dir", default=None, metavar="DIR",
                    help="where reproduction files go (default: $KVORACLE_SHADOW_DIR or the temp dir)")




def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from kvoracle.oracle.engines import load_adapter, protocol_of
    from kvoracle.oracle.isolation import Ended
    from kvoracle.oracle.preflight import Built, built_alone, preflight

    specs: list[str] = config.getoption("kvoracle_adapter")
    for spec in specs:
        try:  # an adapter that cannot be had is a usage error, not a failed test
            adapter = load_adapter(spec)
        except (ValueError, ImportError) as e:
            raise pytest.UsageError(f"--kvoracle-adapter {spec}: {e}") from None
        level = protocol_of(adapter)
        if config.getoption("kvoracle_isolated"):  # built in a child: the session's process stays as it was (CUDA)
            answer = built_alone(adapter)  # watched as kvoracle check watches it: a hang is a usage error
            # an engine that ends the process as it is built: its test says so, with the program
            built = Built("", bool(getattr(adapter, "bad_inputs", None))) if isinstance(answer, Ended) else answer
        else:
            built = preflight(adapter, watched=False)
        if built.problem:
            raise pytest.UsageError(f"--kvoracle-adapter {spec}: the {getattr(adapter, 'name', adapter.__name__)} "
                                    f"adapter {built.problem}")
        items.append(AdapterItem.from_parent(session, name=f"kvoracle[{spec}]", spec=spec, adapter=adapter))
        if level == "engine" and built.bad_inputs:
            items.append(AdapterItem.from_parent(session, name=f"kvoracle[{spec} +bad input]", spec=spec,
                                                 adapter=adapter, bad_input=True))


def drawn_at_random(machine: type[RuleBasedStateMachine], seed: int, examples: int, steps: int, rerun: str,
                    reproduce: Callable[[Callable[[], RunResult]], str | None] = lambda _: None) -> None:
    """The machine's programs drawn by the random generator (`kvoracle check --generator
    random`), unwatched as Hypothesis's are here: its finding raised with the shrunk
    program as a note, as Hypothesis shows one, the command that runs it again, and what
    `reproduce` says of the reproduction file it writes."""
    from kvoracle.oracle.campaign import run_machine

    result = run_machine(machine, seed_value=seed, examples=examples, steps=steps, generator="random", guard=False)
    if result.violation is not None:
        program = "\n".join(result.shown) or "(no program: the finding above says why)"
        result.violation.add_note(f"the program, drawn at random (seed {seed}) and shrunk:\n{program}\n"
                                  f"to run it again: {rerun}")
        if said := reproduce(lambda: result):
            result.violation.add_note(said)
        raise result.violation


def reproduction(machine: type[RuleBasedStateMachine], adapter: type, bad_input: bool, repro_dir: str | None,
                 found: Callable[[], RunResult]) -> str | None:
    """What a finding's note says of its engine calls (a Scripted adapter's): the
    reproduction file of the finding `found` gives, written into `repro_dir`, and what it
    did run alone; without a directory, how to get one. None: nothing to write."""
    from kvoracle.oracle.engine import Scripted
    from kvoracle.oracle.findings import campaign_suffix, standalone, write_reproduction

    if not issubclass(adapter, Scripted):
        return None
    if repro_dir is None:
        return "its engine calls, as a file that runs alone: add --kvoracle-repro-dir DIR"
    result = found()
    written = write_reproduction(machine, result, Path(repro_dir), str(getattr(adapter, "name", "adapter")),
                                 campaign_suffix(result, bad_input))
    if written is None:
        return ("no reproduction file: no engine calls to replay (the finding is the adapter's own, or the "
                "campaign run again for its program found none)")
    path, failure = written
    assert result.violation is not None
    return standalone(path, failure, result.first_id, str(result.violation)).strip()


class AdapterItem(pytest.Item):
    def __init__(self, *, spec: str, adapter: type, bad_input: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.adapter = adapter
        self.bad_input = bad_input

    def runtest(self) -> None:
        from hypothesis import HealthCheck, settings
        from hypothesis import seed as seeded
        from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

        from kvoracle.oracle.campaign import generators, run_machine, seed_alone
        from kvoracle.oracle.survival import alone
        from kvoracle.testing import machine_for, unexplained

        machine = machine_for(self.adapter, bad_input=self.bad_input)
        opt = self.config.getoption
        config = unexplained(settings(max_examples=opt("kvoracle_examples"), stateful_step_count=opt("kvoracle_steps"),
                                      deadline=None, database=None, suppress_health_check=list(HealthCheck)))

        def reproduce(found: Callable[[], RunResult]) -> str | None:
            return reproduction(machine, self.adapter, self.bad_input, opt("kvoracle_repro_dir"), found)

        def campaign_again() -> RunResult:  # Hypothesis's finding, found again with its program
            return run_machine(machine, seed_value=opt("kvoracle_seed"), examples=opt("kvoracle_examples"),
                               steps=opt("kvoracle_steps"), generator="hypothesis", guard=False)

        def by_hypothesis(machine: type[RuleBasedStateMachine]) -> None:
            try:
                with seed_alone():  # the same programs whatever the test session loaded
                    seeded(opt("kvoracle_seed"))(get_state_machine_test(machine, settings=config))()
            except Exception as e:
                if said := reproduce(campaign_again):
                    e.add_note(said)
                raise

        def at_random(machine: type[RuleBasedStateMachine]) -> None:
            drawn_at_random(machine, opt("kvoracle_seed"), opt("kvoracle_examples"), opt("kvoracle_steps"),
                            f"pytest --kvoracle-adapter {self.spec} --kvoracle-generator random "
                            f"--kvoracle-seed {opt('kvoracle_seed')}", reproduce)

        for generator in generators(machine, opt("kvoracle_generator")):
            run = by_hypothesis if generator == "hypothesis" else at_random
            if opt("kvoracle_isolated"):
                alone(machine, run)
            else:
                run(machine)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        what = "kvoracle bad-input machine" if self.bad_input else "kvoracle machine"
        return Path(self.spec.rpartition(":")[0]), None, f"{what} on {self.spec}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return described(excinfo.value)


def described(e: BaseException) -> str:
    """A finding as the failure shows it: its message and notes (the shrunk program, the
    reproduction), and each of a group's failures so (Hypothesis raises a group when one
    seed shows distinct failures)."""
    text = str(e) + "".join(f"\n{n}" for n in getattr(e, "__notes__", []))
    if isinstance(e, BaseExceptionGroup):
        text += "".join(f"\n\n--- failure {i} of {len(e.exceptions)} ---\n{described(sub)}"
                        for i, sub in enumerate(e.exceptions, 1))
    return text
