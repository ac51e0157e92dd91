"""Shadow mode finds a deadlock of released vLLM in its real Scheduler: vLLM issue 30659,
requests whose remote KV loads have ended wait, holding the blocks the loads filled,
behind a request that cannot be given its blocks, and nothing runs again. The scheduler
is driven as the hunt row `vllm-remote-kv-head-of-line` found it (its shrunk program),
with kvoracle's connector in place of a remote peer (oracle/engines/vllm_connector.py).

Run in any vLLM environment the connector adapter supports (0.12.0 .. 0.34.0): `make test-engines` runs it
on 0.34.0 (fixed: no alarm); on a release before 0.19.0 (PR 37307), such as the hunt's
`.venv-hunt/vllm-0.17.1`, it expects the alarm (seen on 0.12.0 .. 0.17.1):

    PYTHONPATH=. .venv-hunt/vllm-0.17.1/bin/python -m pytest tests/test_shadow_vllm_deadlock.py
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is installed by `make engines` in .venv-vllm")

from kvoracle import shadow  # noqa: E402
from kvoracle.oracle.engines.vllm_connector import RemoteKvHeadOfLine  # noqa: E402
from kvoracle.spec.types import RequestId  # noqa: E402

FIXED = (0, 19, 0)  # PR 37307: a load starts only when the whole prompt fits
PROMPTS = [[1, 1, 1, 1, 2, 2, 2, 2, 1, 1], [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 4, 4, 4, 4],
           [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 5, 5, 5, 5], [1, 1, 1, 1, 2, 2, 1, 1]]


def release() -> tuple[int, ...]:
    return tuple(int(part) for part in version("vllm").split("+")[0].split(".")[:3])


def test_the_issue_30659_deadlock_is_live_admit_in_shadow_mode_where_the_release_has_it(tmp_path: Path) -> None:
    if release() < RemoteKvHeadOfLine.versions[0]:
        pytest.skip("kvoracle's own connector is driven from 0.12.0 (Scheduler._preempt_request)")
    a = RemoteKvHeadOfLine()
    s = shadow.attach(a.sched, engine="vllm-scheduler", mode="record", report_dir=tmp_path)
    a.submit(RequestId(0), PROMPTS[0])
    a.schedule(())
    for r in (1, 2, 3):
        a.submit(RequestId(r), PROMPTS[r])
    a.tick(2)
    a.evict_all()
    a.schedule(())
    a.schedule(())
    assert s.tally.steps >= 3 and s.tally.internal == [], s.summary()  # a busy engine schedules on tick too
    if release() >= FIXED:
        assert s.alarms == [], s.summary()
    else:
        assert [x.id for x in s.alarms] == ["LIVE-ADMIT"], s.summary()
        assert "no request ran and no transfer was in flight while r0 (3), r1 (4), r2 (4), r3 (3) waited" in str(
            s.alarms[0].message)
