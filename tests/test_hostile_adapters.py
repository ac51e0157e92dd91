"""Adapters that misbehave where an engine's test suite would not look: in their
constructor, in what they declare, in what they do to the arguments they are given, in
the state they hand back. `kvoracle check` must say so (a usage error, or a finding)
and never pass, hang, or end in a traceback of its own."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace

import pytest

from kvoracle.kvcache.errors import UnknownRequest
from kvoracle.kvcache.faults import Fault
from kvoracle.oracle import watchdog
from kvoracle.oracle.campaign import replay
from kvoracle.oracle.cli import main, numbered, run_target
from kvoracle.oracle.engine import MOST_BLOCKS, NOBODY, BadInput, MalformedObservation, Observation, view_of
from kvoracle.oracle.engines.reference import ReferenceAdapter
from kvoracle.oracle.engines.reference_scheduler import ReferenceScheduler
from kvoracle.oracle.preflight import preflight, preflight_alone
from kvoracle.oracle.targets import Target
from kvoracle.oracle.violations import PropertyViolated, kept, refused
from kvoracle.spec.invariants import check
from kvoracle.spec.state import Status, System
from kvoracle.spec.types import RequestId

# --- the build ---------------------------------------------------------------------------------


class ExitsAsItStarts(ReferenceScheduler):
    name = "exits-as-it-starts"

    def __init__(self) -> None:
        sys.exit(0)


class ObserveCloses(ReferenceScheduler):
    name = "observe-closes"

    def observe(self) -> Observation:
        raise GeneratorExit


class EndsItsProcess(ReferenceScheduler):
    name = "ends-its-process"

    def __init__(self) -> None:
        os._exit(3)


class LeavesAThread(ReferenceScheduler):
    name = "leaves-a-thread"

    def __init__(self) -> None:
        super().__init__()
        threading.Thread(target=time.sleep, args=(3600,), name="never-ends").start()  # not a daemon


class ObserveHangs(ReferenceScheduler):
    name = "observe-hangs"

    def observe(self) -> Observation:
        time.sleep(3600)
        raise AssertionError("unreachable")


def test_an_adapter_that_exits_or_closes_as_it_is_built_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """SystemExit(0) from the constructor once made `kvoracle check` exit 0 with nothing said."""
    assert preflight(ExitsAsItStarts).problem == "could not build its engine: SystemExit(0)"
    assert preflight(ObserveCloses).problem == "raised in observe(): GeneratorExit()"
    assert main(["check", "--adapter", f"{__file__}:ExitsAsItStarts", "--no-coverage"]) == 2
    assert "the exits-as-it-starts adapter could not build its engine: SystemExit(0)" in capsys.readouterr().err


def test_an_adapter_built_alone_cannot_end_or_hold_the_caller() -> None:
    """`kvoracle check` builds it in a process of its own: one that ends that process is
    said to, and one that leaves a thread running leaves none here (it kept kvoracle
    from exiting after its report)."""
    assert preflight_alone(EndsItsProcess).problem == (
        "ended its process while it was built and first observed: exited with status 3")
    threads = threading.active_count()
    built = preflight_alone(LeavesAThread)
    assert built.problem == "" and built.gaps == () and threading.active_count() == threads


def test_an_adapter_whose_first_look_hangs_is_said_to_after_the_step_timeout() -> None:
    limit = watchdog.LIMIT[0]
    watchdog.set_limit(1)
    try:
        start = time.monotonic()
        problem = preflight_alone(ObserveHangs).problem
    finally:
        watchdog.set_limit(limit)
    assert problem == "did not return from observe() within the step timeout (1 s; --step-timeout)"
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("declared, said", [
    ({"block_size": 0}, "block_size = 0"),
    ({"gpu_blocks": -6}, "gpu_blocks = -6"),
    ({"block_size": 2.0}, "block_size = 2.0"),
    ({"timeout": "4"}, "timeout = '4'"),
    ({"cpu_blocks": True}, "cpu_blocks = True"),
    ({"reserve": 8}, "reserve (8) must leave some of its 8 GPU blocks to requests"),
])
def test_sizes_no_engine_can_have_are_the_adapters_problem(declared: dict[str, object], said: str) -> None:
    """They once became findings against the engine (a VALID-INPUT TypeError, a false
    LIVE-TRANSFER) or a traceback of kvoracle's own."""
    class Declares(ReferenceScheduler):
        def __init__(self) -> None:
            super().__init__()  # an engine built right, declared wrong
            for name, size in declared.items():
                setattr(self, name, size)

    problem = preflight(Declares).problem
    assert problem.startswith("declares ") and said in problem, problem


def test_the_shipped_adapters_declare_what_they_can_have() -> None:
    assert preflight(ReferenceScheduler).problem == "" and preflight(ReferenceAdapter).problem == ""


# --- what the adapter does with what it is given, and what it gives back --------------------------


class FinishDropsTheLastAndHidesIt(ReferenceScheduler):
    """The engine ignores the last request of a batch, and its adapter takes that request out
    of the list it was given."""
    name = "finish-drops-and-hides"

    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None:
        if len(batch) > 1:
            assert isinstance(batch, list)
            batch.pop()
        super().finish(list(batch), faults)


class StateGoesNone(ReferenceScheduler):
    """An abstraction when built, none after: nothing would be refined any more."""
    name = "state-goes-none"

    def state(self) -> System | None:
        self.looks = getattr(self, "looks", 0) + 1
        return super().state() if self.looks == 1 else None


@pytest.mark.parametrize("adapter, caught", [(FinishDropsTheLastAndHidesIt, "LIVE-EXIT"), (StateGoesNone, "REFINEMENT")])
def test_an_adapter_cannot_hide_a_bug_in_what_it_was_given_or_gives_back(adapter: type[ReferenceScheduler],
                                                                         caught: str) -> None:
    row = run_target(Target(adapter.name, "scheduler", None, adapter), [0, 1], 60, 100)
    assert row.verdict == "VIOLATION" and row.first_id == caught, row


def test_a_refusal_is_judged_on_a_copy_of_what_the_adapter_showed_before() -> None:
    """An adapter whose snapshot is one dict refilled in place compared equal to itself,
    so a refusal that changed the state went unseen."""
    shown: dict[str, int] = {"finished": 0}

    def snapshot() -> dict[str, int]:
        return shown

    def finish_the_good_ones_then_refuse() -> bool:
        shown["finished"] += 1
        raise UnknownRequest(NOBODY)

    with pytest.raises(PropertyViolated) as caught:
        refused(BadInput.UNKNOWN_REQUEST.value, UnknownRequest, finish_the_good_ones_then_refuse, snapshot, lambda: None)
    assert caught.value.first_id == "BAD-INPUT"


def test_a_snapshot_is_kept_as_a_copy_whichever_way_it_copies() -> None:
    """Pickling copies a NaN into a new float, unequal to the old: copy.deepcopy keeps it
    shared, so the copy still compares equal and is kept."""
    class Local:  # pickle cannot find a local class: deepcopy copies it
        def __init__(self) -> None:
            self.finished = [0]

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Local) and other.finished == self.finished

    for live in ({"share": math.nan, "finished": [0]}, [Local()], {"finished": [0]}):
        copied = kept(live)
        assert copied == live and copied is not live


def test_a_reference_count_that_is_no_whole_number_is_no_count() -> None:
    """NaN compares false both ways, so it passed as neither negative nor wrong."""
    adapter = ReferenceAdapter()
    adapter.admit("r0", [1, 2, 3, 4])
    seen = adapter.observe()
    assert seen.refcounts and not [v for v in check(view_of(seen, live={"r0": 4})) if v.id == "INV-REFCOUNT"]
    for bad in (math.nan, 1.5):
        odd = replace(seen, refcounts={b: bad for b in seen.refcounts})  # type: ignore[misc]  # the lie told
        assert [v.id for v in check(view_of(odd, live={"r0": 4}))].count("INV-REFCOUNT") == 1


def test_an_observation_no_property_can_be_judged_on_is_said_to_be_the_adapters() -> None:
    """A one-shot iterator for the free list read as empty on its second reading (a false
    INV-CONSERVE against the engine); a pool of 10**30 ids kept kvoracle's own walk busy
    until the step timeout blamed the engine. The first look refuses both; a later
    iterator stops the campaign naming the field (a large pool stays judged where it is
    observed outside campaigns: shadow mode's full checks)."""
    seen = ReferenceAdapter().observe()
    assert seen.free is not None
    one_shot = replace(seen, free=iter(seen.free))  # type: ignore[arg-type]
    with pytest.raises(MalformedObservation):
        view_of(one_shot)
    for odd in (one_shot, replace(seen, ids=range(10**30))):
        class Odd(ReferenceAdapter):
            def observe(self) -> Observation:
                return odd

        assert preflight(Odd).problem.startswith("returned an observation no property can be judged on: the GPU")
    assert view_of(replace(seen, ids=range(MOST_BLOCKS + 1))).gpu.ids == range(MOST_BLOCKS + 1)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("tables", (1, 2), "tables is a tuple, not a mapping"),
    ("refcounts", [1, 2], "refcounts is a list, not a mapping"),
    ("tokens", frozenset({"r0"}), "tokens is a frozenset, not a mapping"),
    ("counters", {"gpu.num_free": 3}, "counters must map each name to a pair"),
    ("counters", None, "counters are None"),
    ("tables", {"r0": 3}, "table of 'r0' is a int, not a collection"),
    ("pinned", {0: 2}, "pinned maps block 0 to a int"),
])
def test_a_field_of_the_wrong_kind_is_said_to_be_the_adapters(field: str, value: object, said: str) -> None:
    """A tuple for the tables, a bare number for a counter's pair: each once raised
    AttributeError or TypeError from spec/'s properties, as if the engine had."""
    odd = replace(ReferenceAdapter().observe(), **{field: value})  # type: ignore[arg-type]  # the lie told
    with pytest.raises(MalformedObservation, match=said):
        view_of(odd)


def test_a_set_given_as_a_list_is_judged_as_the_set() -> None:
    """The properties take set differences of nodes, findable and waiting."""
    seen = ReferenceAdapter().observe()
    listed = replace(seen, nodes=["a"], findable=["a", "b"], waiting=["r1"])  # type: ignore[arg-type]
    assert [v.id for v in check(view_of(listed))] == ["INV-HEAP-SOUND"]


@pytest.mark.parametrize(("field", "value", "named"), [("free", ("0",), "'0'"), ("evictable", (None,), "None"),
                                                       ("tables", {"r0": (1.5,)}, "1.5"), ("in_flight", (True,), "True")])
def test_the_first_look_names_a_block_that_is_not_an_integer(field: str, value: object, named: str) -> None:
    odd = replace(ReferenceAdapter().observe(), **{field: value})  # type: ignore[arg-type]  # the lie told

    class Odd(ReferenceAdapter):
        def observe(self) -> Observation:
            return odd

    assert preflight(Odd).problem == ("returned an observation no property can be judged on: the GPU observation's "
                                      f"{field} names a block by {named}, not by its integer id")


class StatusesBreak(ReferenceScheduler):
    """Its statuses() raises once the engine has taken a few calls (an adapter's own bug)."""
    name = "statuses-break"

    def statuses(self) -> dict[RequestId, Status]:
        self.asked = getattr(self, "asked", 0) + 1
        if self.asked > 6:
            raise KeyError("r3")
        return super().statuses()


def test_what_an_adapter_raises_where_no_check_expected_it_names_the_method() -> None:
    row = run_target(Target(StatusesBreak.name, "scheduler", None, StatusesBreak), [0], 20, 30)
    assert row.result is not None and row.result.violation is not None
    message = row.result.violation.violations[0].message
    entry, _, raised = message.partition(", from ")  # the adapter's method kvoracle called, and where it raised
    assert entry.startswith("the run raised KeyError('r3') in ") and entry.endswith(")"), message
    assert entry.split(" in ")[1].split("(")[0] in ("snapshot", "statuses", "state", "observe"), message
    assert raised.startswith("statuses() (test_hostile_adapters.py:"), message
    again = replay(Target(StatusesBreak.name, "scheduler", None, StatusesBreak).machine(), row.result.counterexample)
    assert again is not None and again.violations[0].message == message  # a replay's eval is not the adapter



class ObserveBreaksInTheDrain(ReferenceScheduler):
    """Its observe() raises once the machine drains the engine at the end of a program."""
    name = "observe-breaks-in-the-drain"

    def observe(self) -> Observation:
        if any(f.name == "teardown" for f in traceback.extract_stack()):
            raise RuntimeError("observe broke in the drain")
        return super().observe()


class ObserveBreaksOnTheFifthLook(ReferenceScheduler):
    name = "observe-breaks-on-the-fifth-look"

    def observe(self) -> Observation:
        self.looks = getattr(self, "looks", 0) + 1
        if self.looks == 5:
            raise RuntimeError("observe broke on look 5")
        return super().observe()


@pytest.mark.parametrize(("adapter", "step"), [(ObserveBreaksInTheDrain, "teardown"),
                                               (ObserveBreaksOnTheFifthLook, "the last step")])
def test_a_raise_no_check_expected_is_placed_in_the_drain_or_the_last_step(adapter: type[ReferenceScheduler],
                                                                         step: str) -> None:
    row = run_target(Target(adapter.name, "scheduler", None, adapter), [0], 10, 20)
    assert row.result is not None and row.result.violation is not None
    assert row.result.violation.step == step
    assert row.result.violation.violations[0].message.startswith("the run raised RuntimeError('observe broke")
    drain = "  then the drain at the end (the check fired there)"
    assert (numbered(row.result)[-1] == drain) == (step == "teardown")
