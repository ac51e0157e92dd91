"""Shadow mode on vLLM's real KVCacheManager, BlockPool and Scheduler (0.11.2 .. 0.34.0; run in
the vLLM environment: `make test-engines`, or PYTHONPATH=. with vLLM installed).

The project's workload (bench/engine_speed.py over bench/workload.py's conversations)
and the full Scheduler raise no alarm; a planted misuse raises the right ID; and the two
suspected false alarms of issue 18 are shown real for a naive observation and absent
from the observer's: two live requests on the null block, and the deferred free."""

from __future__ import annotations

import random
import runpy
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is installed by `make engines` in .venv-vllm")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_speed import measure, vllm_driver  # noqa: E402
from workload import conversation_turns  # noqa: E402

from kvoracle import shadow  # noqa: E402
from kvoracle.oracle.engine import BadInput, view_of  # noqa: E402
from kvoracle.oracle.engines.shadow_vllm import FLAT_TOUCH_FROM  # noqa: E402
from kvoracle.oracle.engines.vllm import SCHEDULER_PREAMBLE, VllmAdapter, common, manager_preamble, manager_sizes  # noqa: E402
from kvoracle.oracle.engines.vllm_connector import vllm_version  # noqa: E402
from kvoracle.shadow import ShadowAlarm  # noqa: E402
from kvoracle.spec import invariants  # noqa: E402

pytest_plugins = ("pytester",)


def naive(mgr: Any) -> list[str]:
    """The adapter's observation as a first wrapper would use it: group 0's tables, the
    null block included, nothing held outside the tables."""
    o = VllmAdapter.observe(SimpleNamespace(pool=mgr.block_pool, mgr=mgr))  # type: ignore[arg-type]
    return [str(v) for v in invariants.check(view_of(replace(o, ids=range(1, mgr.block_pool.num_gpu_blocks))))]


# --- the project's workload ---------------------------------------------------------------


def test_project_workload_raises_no_alarm(tmp_path: Path) -> None:
    """engine_speed's vLLM driver over workload.py's conversations: 64 blocks, 8 live, so
    allocate_slots refuses often and cached blocks are evicted for reuse."""
    tally = shadow.install("vllm", mode="raise", full_every=100, report_dir=tmp_path)  # at construction
    try:
        driver: Any = vllm_driver(64)
        result = measure(driver, conversation_turns(random.Random(0), 300, 16), live=8)
        shadow._installs["vllm"].audit()
    finally:
        shadow.uninstall("vllm")
    assert tally.engines == 1 and tally.alarms == [] and tally.internal == [] and tally.unconfirmed == 0
    assert tally.calls > 800 and tally.incremental > 400 and tally.full >= 8
    assert 0 < result["admitted"] < 300  # pressure: some were refused


def scheduler(blocks: int, defer: bool) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(SCHEDULER_PREAMBLE.replace("num_blocks=7,", f"num_blocks={blocks},")
         .replace("num_gpu_blocks = 7", f"num_gpu_blocks = {blocks}"), ns)
    if defer and not hasattr(ns["sched"], "deferred_frees"):
        pytest.skip("this release frees a finished request's blocks at once: deferred frees came in 0.24.0")
    ns["sched"].defer_block_free = defer  # as with an async KV connector and several batches in flight
    return ns


@pytest.mark.parametrize("defer", [False, True], ids=["frees", "deferred-frees"])
def test_full_scheduler_workload_raises_no_alarm(defer: bool, tmp_path: Path) -> None:
    """vLLM's own Scheduler admits, decodes, preempts and finishes the conversations.
    Requests end while their step is in flight (between schedule and update_from_output),
    so with deferred frees their blocks wait in the scheduler for the step to land."""
    ns = scheduler(41, defer)
    sched, aborted = ns["sched"], ns["RequestStatus"].FINISHED_ABORTED
    s = shadow.attach(ns["mgr"], engine="vllm", full_every=50, report_dir=tmp_path)
    steps = shadow.attach(sched, engine="vllm-scheduler", report_dir=tmp_path)  # LIVE-ADMIT, LIVE-PROGRESS
    decoded: dict[str, int] = {}
    deferred = 0

    def step(end: int) -> None:
        nonlocal deferred
        out = sched.schedule()
        for rid in out.num_scheduled_tokens:
            decoded[rid] = decoded.get(rid, 0) + 1
        done = [rid for rid, n in decoded.items() if n >= end and rid in sched.requests]
        if done:
            sched.finish_requests(done, aborted)
            deferred += sum(len(b) for _, b in getattr(sched, "deferred_frees", ()))
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ns["runner_output"](ids, [[1] for _ in ids]))

    for i, prompt in enumerate(conversation_turns(random.Random(1), 40, 4)):
        sched.add_request(ns["request"](f"q{i}", prompt))
        for _ in range(3):
            step(8)
    while sched.requests:
        step(0)
    s.audit()
    assert s.alarms == [] and s.tally.internal == [], s.summary()
    assert s.calls > 300 and s.tally.incremental > 100
    assert (deferred > 0) == defer
    assert steps.alarms == [] and steps.tally.internal == [] and steps.tally.steps > 100, steps.summary()


def run_steps(ns: dict[str, Any], steps: int) -> None:
    sched = ns["sched"]
    for _ in range(steps):
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ns["runner_output"](ids, [[1] for _ in ids]))


def test_a_scheduler_that_schedules_nothing_for_its_running_requests_is_live_progress(tmp_path: Path) -> None:
    """A planted livelock: the step's token budget is spent before the running requests
    get any (a budget miscount); they hold their blocks and never compute a token."""
    ns = scheduler(41, False)
    sched = ns["sched"]
    s = shadow.attach(sched, engine="vllm-scheduler", report_dir=tmp_path)
    for i in range(2):
        sched.add_request(ns["request"](f"p{i}", [i + 1] * 20))
    run_steps(ns, 3)  # admitted, prefilled, decoding
    sched.max_num_scheduled_tokens = 0
    run_steps(ns, 1)  # the first step that stands still is the grace
    with pytest.raises(ShadowAlarm, match="LIVE-PROGRESS: 2 scheduling steps in a row made no progress: p0 "):
        run_steps(ns, 1)
    assert s.tally.steps == 5


def test_a_scheduler_whose_allocator_never_finds_room_is_live_admit(tmp_path: Path) -> None:
    """A planted stall: with every block free and nothing running, the allocator refuses
    a request that fits, and the scheduler leaves it waiting."""
    ns = scheduler(41, False)
    sched = ns["sched"]
    s = shadow.attach(sched, engine="vllm-scheduler", report_dir=tmp_path)
    sched.kv_cache_manager.allocate_slots = lambda *args, **kwargs: None
    sched.add_request(ns["request"]("w0", [3] * 20))
    run_steps(ns, 1)
    with pytest.raises(ShadowAlarm, match=r"LIVE-ADMIT: 2 scheduling steps in a row stalled: .* w0 \(6\) waited"):
        run_steps(ns, 1)
    assert s.tally.steps == 2


# --- planted misuse -----------------------------------------------------------------------


def adapter_with_shadow(tmp_path: Path) -> tuple[VllmAdapter, shadow.Shadow]:
    a = VllmAdapter()
    return a, shadow.attach(a.mgr, engine="vllm", report_dir=tmp_path)


def test_a_held_block_freed_through_the_pool_is_inv_no_uaf(tmp_path: Path) -> None:
    a, s = adapter_with_shadow(tmp_path)
    a.admit("r0", [3] * 9)  # two full blocks (cached) and a partial one (private)
    table = a.mgr.coordinator.single_type_managers[0].req_to_blocks["r0"]
    with pytest.raises(ShadowAlarm) as caught:
        a.pool.free_blocks([table[-1]])
    ids = [x.id for x in caught.value.alarms]
    assert ids[0] == "INV-NO-UAF" and "INV-REFCOUNT" in ids
    first = caught.value.alarms[0]
    assert first.blocks == (table[-1].block_id,) and first.after.name == "pool.free_blocks"
    assert [c.name for c in first.history] == ["mgr.allocate_slots", "pool.free_blocks"]


def test_a_held_cached_block_freed_is_inv_refcount_and_the_reproduction_replays(tmp_path: Path) -> None:
    a, s = adapter_with_shadow(tmp_path)
    a.admit("r0", [3] * 9)
    a.admit("r1", [3] * 8 + [4])  # shares the two cached blocks
    cached = a.mgr.coordinator.single_type_managers[0].req_to_blocks["r0"][0]
    with pytest.raises(ShadowAlarm) as caught:
        a.pool.free_blocks([cached])
    alarm = caught.value.alarms[0]
    assert alarm.id == "INV-REFCOUNT" and f"block {cached.block_id}: 1 (held by 2)" in alarm.message
    assert alarm.reproduction is not None
    with pytest.raises(ShadowAlarm, match="INV-REFCOUNT"):
        runpy.run_path(alarm.reproduction)


def test_double_free_through_the_pool_is_inv_refcount(tmp_path: Path) -> None:
    a, s = adapter_with_shadow(tmp_path)
    with pytest.raises(ShadowAlarm, match=r"INV-REFCOUNT: blocks \[\d+\] have a negative reference count"):
        a.bad_input(BadInput.DOUBLE_FREE, None)  # the adapter's bad input: a free block freed again


def test_a_free_that_raises_is_live_exit_and_the_exception_passes_through(tmp_path: Path) -> None:
    a, s = adapter_with_shadow(tmp_path)
    a.admit("r0", [3] * 9)
    req = a.namespace["r0"]
    error = RuntimeError("storage write failed")

    def failing(rid: str) -> None:
        raise error

    a.mgr.coordinator.free = failing  # the manager's free path raises before returning the blocks
    with pytest.raises(RuntimeError) as raised:
        a.mgr.free(req)
    assert raised.value is error and "LIVE-EXIT" in "".join(getattr(error, "__notes__", []))
    assert s.alarms[0].id == "LIVE-EXIT" and s.alarms[0].check == "raise"
    assert "request r0 still holds blocks" in s.alarms[0].message


# --- the two suspected false alarms of issue 18 -------------------------------------------


SLIDING = common(4, 16, 256) + """
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm.v1.core.kv_cache_manager import KVCacheManager
window = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=8)
config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], window)])
mgr = KVCacheManager(config, max_model_len=256""" + manager_sizes(4, vllm_version()) + """)
"""


def test_two_live_requests_on_the_null_block_are_not_an_alarm(tmp_path: Path) -> None:
    """A sliding-window manager points the skipped positions of every request at the null
    block 0. A naive observation calls that INV-TIER and INV-NO-UAF (two requests own
    block 0): a false alarm. The observer leaves the placeholder out of the tables."""
    ns: dict[str, Any] = {}
    exec(SLIDING, ns)
    mgr = ns["mgr"]
    s = shadow.attach(mgr, engine="vllm", full_every=1, report_dir=tmp_path)
    requests = [ns["request"](rid, [t] * 10) for rid, t in (("a", 1), ("b", 2))]
    for r in requests:
        hit, n = mgr.get_computed_blocks(r)[:2]  # 0.26.0+ adds a third answer
        mgr.allocate_slots(r, r.num_tokens - n, n, hit)
        r.num_computed_tokens = r.num_tokens
    for _ in range(6):
        for r in requests:
            r.append_output_token_ids([7])
            assert mgr.allocate_slots(r, 1) is not None
            r.num_computed_tokens = r.num_tokens
    tables = mgr.coordinator.single_type_managers[0].req_to_blocks
    assert all(tables[r.request_id][0] is mgr.block_pool.null_block for r in requests)  # both hold block 0
    assert any(v.startswith("INV-NO-UAF: request a lists GPU block 0, owned by request b") for v in naive(mgr))
    assert any(v.startswith("INV-TIER") for v in naive(mgr))
    assert s.alarms == [] and s.calls == 16 and s.tally.full >= 14
    for r in requests:
        mgr.free(r)
    assert s.audit() == []  # and every block is free or reclaimable again


def test_the_deferred_free_is_not_an_alarm_and_is_still_checked(tmp_path: Path) -> None:
    """vLLM's Scheduler with deferred frees: finishing a request while its step may still
    write pops its blocks (`pop_blocks_for_free`) and returns them to the pool after the
    step (`free_blocks(reversed(blocks))`). In between, a naive observation sees blocks
    with references and no table: INV-REFCOUNT and INV-CONSERVE, a false alarm. The
    observer counts the popped blocks as held by the deferred free until it lands."""
    ns = scheduler(7, defer=True)
    sched, mgr = ns["sched"], ns["mgr"]
    s = shadow.attach(mgr, engine="vllm", full_every=1, report_dir=tmp_path)
    sched.add_request(ns["request"]("r0", [1] * 9))
    sched.add_request(ns["request"]("r1", [1] * 8 + [2]))
    ns["step"]()
    out = sched.schedule()
    sched.finish_requests("r0", ns["RequestStatus"].FINISHED_ABORTED)
    assert [[b.block_id for b in blocks] for _, blocks in sched.deferred_frees] == [[1, 2, 3]]
    found = naive(mgr)
    assert any(v.startswith("INV-REFCOUNT") for v in found) and any("owned by nobody" in v for v in found)
    assert s.alarms == []
    ids = list(out.num_scheduled_tokens)
    sched.update_from_output(out, ns["runner_output"](ids, [[1] for _ in ids]))
    assert not sched.deferred_frees and s.alarms == []
    last = s.history()[-1]
    assert last.name == "pool.free_blocks" and last.blocks is not None and last.blocks >= {1, 2, 3}
    # The window is still checked: a deferred block freed early (a real bug) is found.
    sched.finish_requests("r1", ns["RequestStatus"].FINISHED_ABORTED)
    out = sched.schedule()
    assert not sched.deferred_frees  # nothing in flight for r1 now: freed at once
    popped = mgr.pop_blocks_for_free(ns["request"]("r2", [5]))  # nothing held: an empty deferral
    assert popped == [] and s.alarms == []


def test_a_deferred_block_freed_twice_is_found(tmp_path: Path) -> None:
    ns = scheduler(7, defer=True)
    sched, mgr = ns["sched"], ns["mgr"]
    s = shadow.attach(mgr, engine="vllm", mode="record", report_dir=tmp_path)
    sched.add_request(ns["request"]("r0", [1] * 9))
    ns["step"]()
    sched.schedule()
    sched.finish_requests("r0", ns["RequestStatus"].FINISHED_ABORTED)
    _, blocks = sched.deferred_frees[0]
    mgr.block_pool.free_blocks(reversed(blocks))  # the scheduler's drain, early
    assert s.alarms == []
    mgr.block_pool.free_blocks(reversed(blocks))  # and again
    assert s.alarms and s.alarms[0].id == "INV-REFCOUNT" and "negative" in s.alarms[0].message


# --- what older releases write differently -----------------------------------------------


def test_a_refused_request_and_a_direct_touch_are_read_as_the_release_writes_them(tmp_path: Path) -> None:
    """Up to 0.13.0 a refused allocate_slots leaves the request an empty req_to_blocks entry
    (no table: the manager is quiescent once the rest is freed), and BlockPool.touch takes a
    tuple of per-group block lists (from 0.14.0 one list). Neither is an alarm or an
    observer error on any release."""
    ns: dict[str, Any] = {}
    exec(manager_preamble(), ns)
    mgr, pool = ns["mgr"], ns["pool"]
    s = shadow.attach(mgr, engine="vllm", full_every=1, report_dir=tmp_path)
    r0, r1 = ns["request"]("r0", [1] * 20), ns["request"]("r1", [2] * 12)  # 5 blocks of the 6, then 3
    assert ns["admit"](r0)[0] is not None and ns["admit"](r1)[0] is None
    mgr.free(r0)
    cached = [b for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None][:1]
    pool.touch((cached,) if vllm_version() < FLAT_TOUCH_FROM else cached)  # a hit, taken by hand
    assert cached[0].ref_cnt == 1
    pool.free_blocks(cached)
    assert s.observer.quiescent() and s.audit() == []
    assert s.alarms == [] and s.tally.internal == [], s.summary()


# --- the pytest plugin on a test file that builds a KVCacheManager -------------------------


ENGINE_TESTS = """
from kvoracle.oracle.engines.vllm import manager_preamble


def build():
    ns = {}
    exec(manager_preamble(16, 65, 1024), ns)
    return ns


def test_requests_come_and_go():
    ns = build()
    for i in range(20):
        req = ns["request"](f"r{i}", [i % 3] * 40 + [i] * 7)
        got, _ = ns["admit"](req)
        if got is not None:
            ns["grow"](req, [1] * 16)
            ns["mgr"].free(req)


def test_misuse():
    ns = build()
    req = ns["request"]("x", [9] * 21)
    ns["admit"](req)
    ns["pool"].free_blocks([ns["mgr"].coordinator.single_type_managers[0].req_to_blocks["x"][-1]])
"""


def test_plugin_checks_every_manager_a_test_file_builds(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_engine=ENGINE_TESTS)
    args = ("-p", "kvoracle.shadow", "--kvoracle-shadow", "vllm", "--kvoracle-shadow-dir", str(tmp_path),
            "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result = pytester.runpytest_inprocess(*args, "-k", "come_and_go")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*kvoracle shadow (vllm): 1 engine object(s), * calls, * checked*0 alarm(s)"])
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*2 engine object(s)*", "alarms by ID: *INV-NO-UAF 1*",
                                 "INV-NO-UAF: request x lists GPU block *, which is on the free list",
                                 "*test_engine.py::test_misuse)", "*pool.free_blocks*"])


SCHEDULER_TESTS = """
from kvoracle.oracle.engines.vllm import SCHEDULER_PREAMBLE


def run(stall_after=None):
    ns = {}
    exec(SCHEDULER_PREAMBLE, ns)
    sched = ns["sched"]
    for i in range(2):
        sched.add_request(ns["request"](f"q{i}", [i + 1] * 9))
    for k in range(6):
        if k == stall_after:
            sched.max_num_scheduled_tokens = 0  # the planted livelock
        ns["step"]()


def test_steps():
    run()


def test_stall():
    run(stall_after=3)
"""


def test_plugin_with_both_observers_checks_blocks_and_steps(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """`--kvoracle-shadow vllm+vllm-scheduler`: the manager's blocks and the scheduler's
    steps, in one tally."""
    scheduler(7, False)  # vLLM's scheduler modules imported here: an in-process run drops what it imports
    pytester.makepyfile(test_sched=SCHEDULER_TESTS)
    args = ("-p", "kvoracle.shadow", "--kvoracle-shadow", "vllm+vllm-scheduler", "--kvoracle-shadow-dir",
            str(tmp_path), "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result = pytester.runpytest_inprocess(*args, "-k", "test_steps")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*kvoracle shadow (vllm+vllm-scheduler): 2 engine object(s)*, 6 scheduling steps, "
                                 "0 alarm(s)"])
    result = pytester.runpytest_inprocess(*args)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["alarms by ID: LIVE-PROGRESS 1",
                                 "LIVE-PROGRESS: 2 scheduling steps in a row made no progress: q0 *"])
