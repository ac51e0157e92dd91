"""Engine tests run in the engine's own environment (`make test-engines`); elsewhere
they skip. Each finding's reproduction must still fail on the pinned version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

FINDINGS = Path(__file__).resolve().parents[1] / "docs" / "findings"
_HEADER = re.compile(r"^# kvoracle reproduction: (\S+), (\S+)$", re.M)


def reproductions(engine: str) -> list[Path]:
    return sorted(p for p in FINDINGS.glob("*.py") if _expected(p)[0] == engine)


def _expected(path: Path) -> tuple[str, str]:
    m = _HEADER.search(path.read_text(encoding="utf-8"))
    assert m, f"{path} has no reproduction header"
    return m.group(1), m.group(2)


def assert_reproduces(path: Path) -> None:
    """The file fails, with an AssertionError that starts with the ID its header names."""
    _, want = _expected(path)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode != 0, f"{path.name} no longer fails: the engine may have fixed it"
    assert last.startswith(f"AssertionError: {want}"), f"{path.name} failed otherwise: {last}"
