"""The pytest plugin: `pytest --kvoracle-adapter MODULE:CLASS` adds one test per adapter
that runs its Protocol's machine (see kvoracle.testing), next to the suite's own tests.

pytest loads it from kvoracle's entry point wherever kvoracle is installed; it adds
options only, and no test unless --kvoracle-adapter is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvoracle", "kvoracle: check a KV-cache adapter with kvoracle's machines")
    group.addoption("--kvoracle-adapter", action="append", default=[], metavar="MODULE:CLASS",
                    help="run the machine of this adapter's Protocol (MODULE:CLASS or FILE.py:CLASS; repeatable)")
    group.addoption("--kvoracle-examples", type=int, default=100, metavar="N",
                    help="programs per adapter (default 100)")
    group.addoption("--kvoracle-steps", type=int, default=50, metavar="N", help="max steps per program (default 50)")
    group.addoption("--kvoracle-seed", type=int, default=0, metavar="N", help="seed of the programs (default 0)")
    group.addoption("--kvoracle-isolated", action="store_true",
                    help="run each adapter's machine in a forked process: an engine that ends the process fails "
                         "its test with the program that ended it, and the session goes on (not once CUDA is "
                         "initialised in the session)")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    from kvoracle.oracle.engines import load_adapter

    specs: list[str] = config.getoption("kvoracle_adapter")
    for spec in specs:
        try:  # an adapter that cannot be had is a usage error, not a failed test
            load_adapter(spec)
        except (ValueError, ImportError) as e:
            raise pytest.UsageError(f"--kvoracle-adapter {spec}: {str(e).removeprefix('--adapter: ')}") from None
        items.append(AdapterItem.from_parent(session, name=f"kvoracle[{spec}]", spec=spec))


class AdapterItem(pytest.Item):
    def __init__(self, *, spec: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def runtest(self) -> None:
        from hypothesis import HealthCheck, settings
        from hypothesis import seed as seeded
        from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

        from kvoracle.oracle.campaign import seed_alone
        from kvoracle.oracle.engines import load_adapter
        from kvoracle.oracle.survival import alone
        from kvoracle.testing import machine_for

        machine = machine_for(load_adapter(self.spec))
        opt = self.config.getoption
        config = settings(max_examples=opt("kvoracle_examples"), stateful_step_count=opt("kvoracle_steps"),
                          deadline=None, database=None, suppress_health_check=list(HealthCheck))

        def run(machine: type[RuleBasedStateMachine]) -> None:
            with seed_alone():  # the same programs whatever the test session loaded
                seeded(opt("kvoracle_seed"))(get_state_machine_test(machine, settings=config))()

        if opt("kvoracle_isolated"):
            alone(machine, run)
        else:
            run(machine)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return Path(self.spec.rpartition(":")[0]), None, f"kvoracle machine on {self.spec}"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value) + "".join(f"\n{n}" for n in getattr(excinfo.value, "__notes__", []))

