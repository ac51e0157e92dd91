"""Engine tests run in the engine's own environment (`make test-engines`); elsewhere
they skip. Each finding's reproduction must still fail on the pinned version."""

from __future__ import annotations

from pathlib import Path

from kvoracle.oracle.findings import confirms, header, run_reproduction

FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "findings"


def reproductions(engine: str) -> list[Path]:
    return sorted(p for p in FINDINGS.glob("*.py") if header(p.read_text(encoding="utf-8"))[0] == engine)


def assert_reproduces(path: Path) -> None:
    """The file fails, with an AssertionError that starts with the ID its header names."""
    _, want = header(path.read_text(encoding="utf-8"))
    failure = run_reproduction(path)
    assert failure, f"{path.name} no longer fails: the engine may have fixed it"
    assert confirms(failure, want), f"{path.name} failed otherwise: {failure}"
