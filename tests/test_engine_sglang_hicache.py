"""SGLang's tiered cache (device pool, host pool, storage, its controller threads) through
the scheduler adapter oracle.engines.sglang_hicache. The campaign runs where sglang
(0.5.5.post3 .. 0.5.23) is installed; elsewhere it skips."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvoracle.kvcache.faults import FaultKind
from kvoracle.oracle.engines import protocol_of
from kvoracle.oracle.engines.sglang import sglang_version
from kvoracle.oracle.engines.sglang_hicache import (
    STORAGE_FAULTS,
    BackupGapOrphan,
    BackupThreadDies,
    HostLeafStatus,
    PrefetchDoubleRelease,
    PrefetchStaleAck,
    PrefetchThreadDies,
    SglangHiCache,
)
from kvoracle.oracle.scheduler_machine import FAULTS, _faults, use_faults
from kvoracle.spec.types import RequestId

ROWS = (SglangHiCache, PrefetchDoubleRelease, BackupGapOrphan, HostLeafStatus, BackupThreadDies, PrefetchThreadDies,
        PrefetchStaleAck)
V = sglang_version()
DRIVEN = (0, 5, 5, 3) <= V < (0, 5, 24)


@pytest.mark.parametrize("cls", ROWS, ids=lambda c: c.__name__)
def test_declares_the_fault_kinds_its_storage_can_suffer(cls: type[SglangHiCache]) -> None:
    assert protocol_of(cls) == "scheduler"
    assert cls.fault_kinds <= STORAGE_FAULTS  # storage calls are synchronous: no HANG, no TWICE
    assert FaultKind.HANG not in cls.fault_kinds and FaultKind.TWICE not in cls.fault_kinds
    try:
        use_faults(cls.fault_kinds)
        drawn = {f.kind for u in range(1, 400) for f in _faults(u)}
    finally:
        use_faults(None)
    assert drawn <= cls.fault_kinds | {FaultKind.OK}
    assert cls.fault_kinds & {f.kind for f in FAULTS} <= drawn


def test_importing_the_adapter_does_not_import_sglang() -> None:
    code = ("import sys, kvoracle.oracle.engines.sglang_hicache, kvoracle.oracle.engines.sglang_storage; "
            "assert 'sglang' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not DRIVEN, reason="needs sglang 0.5.5.post3 .. 0.5.23 (engines/hunt/)")
def test_default_campaign_passes() -> None:
    from kvoracle.oracle.cli import run_target
    from kvoracle.oracle.targets import Target

    row = run_target(Target(SglangHiCache.name, "scheduler", None, SglangHiCache), [0], examples=20, steps=40)
    assert row.verdict == "pass", row.result and row.result.violation
    assert row.steps > 100


@pytest.mark.skipif(not DRIVEN, reason="needs sglang 0.5.5.post3 .. 0.5.23 (engines/hunt/)")
def test_script_replays_standalone() -> None:
    from kvoracle.kvcache.faults import Fault

    a = SglangHiCache()
    a.submit(RequestId(0), [1] * 8 + [2] * 12)
    a.schedule([])
    a.finish(a.running(), [Fault(FaultKind.ERROR)])
    a.tick(2)
    script = "\n".join(a.script()) + "\nassert len(REQS) == 1 and REQS[0].state == 'finished'\nclose()\n"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)
