"""A call into the engine that never returns is a finding (VALID-INPUT, EngineHung), and
the campaign goes on (oracle.watchdog)."""

from __future__ import annotations

import signal
import threading

import pytest

from kvoracle.oracle import watchdog
from kvoracle.oracle.campaign import run_machine
from kvoracle.oracle.cli import Settings, run_target
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.targets import Target
from kvoracle.spec.types import Outcome, TransferId

FOREVER = 60.0  # seconds a hung call waits when nothing interrupts it (the test then fails)


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
