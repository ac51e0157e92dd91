"""Shadow mode on SGLang's RadixCache and paged allocator, 0.5.5.post3 .. 0.5.23 (run in
an SGLang environment: `make test-engines`, or PYTHONPATH=. with SGLang installed).

The project's workload (bench/engine_speed.py over bench/workload.py's conversations,
plus decode growth) raises no alarm; each planted misuse of the adapter raises its ID."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is installed by `make engines` in .venv-sglang", allow_module_level=True)

from kvoracle.oracle.engines.sglang import STANDIN  # noqa: E402

exec(STANDIN, {})  # what a CPU machine cannot load (tried: 0.5.15 to 0.5.22 import torchvision as sglang loads)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from engine_speed import measure, sglang_driver  # noqa: E402
from workload import conversation_turns  # noqa: E402

from kvoracle import shadow  # noqa: E402
from kvoracle.oracle.engine import BadInput  # noqa: E402
from kvoracle.oracle.engines.sglang import SglangAdapter, sglang_version  # noqa: E402
from kvoracle.shadow import ShadowAlarm  # noqa: E402

V = sglang_version()


def test_project_workload_raises_no_alarm(tmp_path: Path) -> None:
    """engine_speed's SGLang driver over workload.py's conversations, 160 pages, 8 live:
    the tree fills and `room` evicts for the shortfall; every call is checked in full."""
    tally = shadow.install("sglang", mode="raise", ring=5000, report_dir=tmp_path)  # at construction
    try:
        driver: Any = sglang_driver(160)
        result = measure(driver, conversation_turns(random.Random(0), 300, 16), live=8)
        inst = shadow._installs["sglang"]
        evicted = sum(1 for s in inst.sessions for c in s.history()
                      if c.name == "tree.evict" and not c.outcome.endswith("evicted 0)"))
        inst.audit()
    finally:
        shadow.uninstall("sglang")
    assert tally.engines == 1 and tally.alarms == [] and tally.internal == []
    assert tally.calls > 1000 and tally.full > 900 and result["admitted"] == 300
    assert evicted > 10


@pytest.mark.parametrize("need_sort", [False, True])
def test_decode_growth_raises_no_alarm(tmp_path: Path, need_sort: bool) -> None:
    """The adapter's preamble with decode: requests grow page by page, finish through
    checkpoint (the tree takes their pages, duplicates are freed), and evict. With
    need_sort (as SGLang builds the allocator under PD disaggregation) freed pages wait
    (release_pages before 0.5.20, staged_pages after) until an alloc runs short: free too."""
    ns: dict[str, Any] = {}
    from kvoracle.oracle.engines.sglang import preamble

    text = preamble(4, 48, rows=16, context=512)
    exec(text.replace("need_sort=False", "need_sort=True") if need_sort else text, ns)
    assert bool(ns["alloc"].need_sort) is need_sort
    s = shadow.attach(ns["tree"], engine="sglang", report_dir=tmp_path)
    live: list[Any] = []
    for i, prompt in enumerate(conversation_turns(random.Random(2), 60, 4)):
        req = ns["request"](f"r{i}", prompt)
        if ns["admit"](req) is not None:
            live.append(req)
        for r in list(live):
            if ns["grow"](r, [i % 7 + 1] * 3) is None or len(r.full_untruncated_fill_ids) > len(prompt) + 20:
                ns["finish"](r)
                live.remove(r)
        if len(live) > 3:
            ns["finish"](live.pop(0))
    for r in live:
        ns["finish"](r)
    s.audit()
    assert s.alarms == [] and s.tally.internal == [], s.summary()
    assert s.calls > 400


def attached(tmp_path: Path) -> tuple[SglangAdapter, shadow.Shadow]:
    a = SglangAdapter()
    return a, shadow.attach(a.tree, engine="sglang", report_dir=tmp_path)


def test_a_double_free_is_inv_conserve(tmp_path: Path) -> None:
    a, s = attached(tmp_path)
    a.admit("r0", [1] * 9)
    with pytest.raises(ShadowAlarm) as caught:
        a.bad_input(BadInput.DOUBLE_FREE, None)
    first = caught.value.alarms[0]
    assert first.id == "INV-CONSERVE" and "on the free list twice" in first.message
    assert first.after.name == "alloc.free" and first.reproduction is not None


def test_a_page_out_of_range_is_inv_tier(tmp_path: Path) -> None:
    a, s = attached(tmp_path)
    with pytest.raises(ShadowAlarm) as caught:
        a.bad_input(BadInput.OUT_OF_RANGE, None)
    assert [x.id for x in caught.value.alarms][0] == "INV-TIER"
    assert "id 7, outside 1..6" in caught.value.alarms[0].message


def test_a_double_unlock_is_inv_refcount(tmp_path: Path) -> None:
    """r1 finished (its lock given back); unlocking its node again takes r2's lock away:
    the prefix r2 holds becomes evictable (lock_ref 0, held by r2's lock). Before 0.5.22
    a lock is a bare count on the node, which names no holder: the extra unlock passes
    for r2's, and is found when r2 gives its own lock back (lock_ref below the holders)."""
    a, s = attached(tmp_path)
    a.admit("r0", [1] * 8)
    a.finish("r0")  # the tree keeps the two pages
    a.admit("r1", [1] * 8)
    a.admit("r2", [1] * 8)
    a.finish("r1")
    with pytest.raises(ShadowAlarm) as caught:
        assert a.bad_input(BadInput.DOUBLE_UNLOCK, "r1")
        a.finish("r2")
    first = caught.value.alarms[0]
    assert first.id == "INV-REFCOUNT", first.report()
    if V >= (0, 5, 22):
        assert "0 (held by 1)" in first.message and first.after.name == "tree.dec_lock_ref"
    assert any(c.name == ("tree.lock" if V >= (0, 5, 22) else "tree.inc_lock_ref") for c in first.history)


def test_a_leaked_tail_is_found_when_nothing_is_live(tmp_path: Path) -> None:
    """finish without freeing the unaligned tail: once no request is live, the page
    the allocator handed out is owned by nobody (INV-CONSERVE) and the drain fails."""
    a, s = attached(tmp_path)
    s.mode = "record"
    a.admit("r0", [1] * 9)  # two full pages and a tail page
    if V >= (0, 5, 22):
        a.run("tree.checkpoint(r0, up_to=9)")
        a.run("tree.unlock(r0.lock)")
    else:  # the tree keeps nothing: all three pages leak
        a.run("tree.dec_lock_ref(r0.last_node)")
    a.run("free_row(r0)")
    del a.live["r0"]
    ids = {x.id for x in s.audit()}
    assert {"INV-CONSERVE", "LIVE-DRAIN"} <= ids, [str(x.violation) for x in s.alarms]
