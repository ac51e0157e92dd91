"""A call into the engine that never returns is a finding (VALID-INPUT, EngineHung), and
the campaign goes on (oracle.watchdog)."""

from __future__ import annotations

import importlib
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvoracle.oracle import findings, watchdog
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.cli import Settings, run_target
from kvoracle.oracle.engine_campaign import run_engine
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.targets import Target
from kvoracle.spec.types import Outcome, TransferId

FOREVER = 60.0  # seconds a hung call waits when nothing interrupts it (the test then fails)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
ToyAdapter: Any = importlib.import_module("toy_engine").ToyAdapter  # docs/examples/toy_engine.py


class HangingToy(ToyAdapter):  # type: ignore[misc]
    """The toy engine, whose evict of 3 or more blocks waits for ever (in its script, so
    the reproduction makes the same call)."""

    name = "hanging_toy"

    def evict(self, blocks: int) -> object:
        if blocks >= 3:
            self.run("import threading\nthreading.Event().wait(60)")
        return super().evict(blocks)


@pytest.fixture()
def short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "LIMIT", [0.3])
    monkeypatch.setattr(watchdog, "AFTER_HANG", 0.5)


def hang() -> None:
    if not threading.Event().wait(FOREVER):  # a lock nobody releases
        raise AssertionError("nothing interrupted the hung call")


def test_a_call_past_the_limit_raises_inside_it_and_what_follows_is_watched_too(short_limits: None) -> None:
    with watchdog.watching():
        watchdog.kick()
        with pytest.raises(watchdog.EngineHung) as first:
            hang()
        with pytest.raises(watchdog.EngineHung) as second:  # no kick: the drop to AFTER_HANG re-armed it
            hang()
        watchdog.pause()
        assert not threading.Event().wait(0.2)  # paused: nothing fires
    assert first.value.seconds == 0.3 and second.value.seconds == 0.3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_every_call_gets_the_whole_limit_and_at_most_its_slack_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls that start within the slack of the last arming keep it; a later one re-arms."""
    armed: list[float] = []
    clock = [100.0]
    monkeypatch.setattr(signal, "setitimer", lambda which, seconds: armed.append(seconds))
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    timer = watchdog._Timer(60.0)
    for now in (100.0, 100.5, 100.6, 100.7):
        clock[0] = now
        timer.kick()
        assert timer.due - now >= 60.0  # this call has its whole limit
        assert timer.due - now <= 60.0 + 1.0  # and at most the slack more
    assert armed == [60.6, 60.6]  # armed at 100.0, re-armed at 100.7 only
    timer.disarm()
    timer.kick()
    assert armed[-1] == 60.6 and len(armed) == 4  # disarm: 0, then armed anew
    watchdog._Timer(1000.0).kick()
    assert armed[-1] == 1001.0  # the slack is a second at most


def test_after_a_hang_calls_get_ten_times_the_longest_that_returned_within_the_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the calls before the hang took, from one start to the next (a program's end and
    the hung call itself not counted), sets the limit of the shrinker's replays."""
    clock = [100.0]
    monkeypatch.setattr(signal, "setitimer", lambda which, seconds: None)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    timer = watchdog._Timer(60.0)
    for now in (100.0, 100.02, 100.05):  # calls of 20 and 30 ms
        clock[0] = now
        timer.kick()
    timer.disarm()
    clock[0] = 130.0  # Hypothesis's work between programs
    timer.kick()
    clock[0] = 130.07  # a call of 70 ms, then one that hangs
    timer.kick()
    clock[0] = 190.0
    with pytest.raises(watchdog.EngineHung):
        timer.fire(signal.SIGALRM, None)
    assert timer.seconds == pytest.approx(0.7)
    assert watchdog.after_hang(0.0) == watchdog.AFTER_HANG  # no call returned: the build may be next
    assert watchdog.after_hang(0.001) == watchdog.AFTER_HANG_LEAST
    assert watchdog.after_hang(30.0) == watchdog.AFTER_HANG


def test_nothing_is_watched_outside_a_campaign_without_a_limit_or_off_the_main_thread(
        short_limits: None, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = signal.getsignal(signal.SIGALRM)
    watchdog.kick()
    assert not threading.Event().wait(0.5)
    outcome: list[BaseException | None] = []

    def in_a_thread() -> None:
        try:
            with watchdog.watching():
                watchdog.kick()
                threading.Event().wait(0.5)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - whatever it is, the test reports it
            outcome.append(e)

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert outcome == [None]
    monkeypatch.setattr(watchdog, "LIMIT", [0.0])
    with watchdog.watching():
        watchdog.kick()
        assert not threading.Event().wait(0.5)
    assert signal.getsignal(signal.SIGALRM) is handler


def test_a_negative_step_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="--step-timeout: the step timeout must be at least 0 s"):
        Settings(step_timeout=-1).check()


class HangingCache(ReferenceCache):
    """An engine whose transfer completion waits for ever on a lock."""

    name = "hanging"

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        hang()


def test_a_hung_engine_is_a_finding_with_an_id_and_the_campaign_goes_on(short_limits: None) -> None:
    # without Hypothesis's shrinking, whose replays would each wait AFTER_HANG (minimize still runs)
    hung = run_machine(Target("hanging", "cache", None, HangingCache).machine(), seed_value=0, examples=10, steps=20,
                       shrink=False)
    after = run_target(Target("reference", "cache", None, ReferenceCache), [0], 10, 20)
    found = hung.violation
    assert found is not None and found.first_id == "VALID-INPUT" and "EngineHung" in str(found)
    assert "complete" in found.step  # the call that hung: a transfer's completion, in a step or in the drain
    assert after.verdict == "pass"


def test_a_hangs_reproduction_fails_standalone_rather_than_hang(short_limits: None, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction of a hung call arms its own limit (findings.watch): run alone, it
    fails with the campaign's ID in about the step timeout, where it used to hang until
    whoever ran it gave up."""
    monkeypatch.setattr(findings, "HUNG_SLACK", 1.0)
    row = run_engine(HangingToy, False, [0], 10, 20, tmp_path)
    assert row.result.first_id == "VALID-INPUT" and row.reproduction is not None
    text = row.reproduction.read_text()
    assert "watch(1.3)" in text and "watch(0)" in text
    assert row.confirmed, row.reproduces  # it ran standalone once, under the parent's (longer) wait
    assert "EngineHung" in row.reproduces and "no answer within" not in row.reproduces
