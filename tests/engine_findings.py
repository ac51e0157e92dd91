"""Engine tests run in the engine's own environment (`make test-engines`); elsewhere
they skip. Each finding's reproduction must still fail on the pinned version."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from kvoracle.oracle.findings import confirms, header, run_reproduction

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "docs" / "findings"


def reproductions(engine: str) -> list[Path]:
    return sorted(p for p in FINDINGS.glob("*.py") if header(p.read_text(encoding="utf-8"))[0] == engine)


def pinned(engine: str) -> str | None:
    """The release `make engines` installs (the Makefile's ENGINE_PIN_<engine>), on which
    the engine's documented reproductions were written; None where none is pinned."""
    found = re.search(rf"^ENGINE_PIN_{engine} := {engine}==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    return found.group(1) if found else None


def installed(engine: str) -> str | None:
    try:
        return version(engine)
    except PackageNotFoundError:
        return None


def _public(release: str) -> str:
    """A release without its local label: 0.34.0+cpu is the pinned 0.34.0, built otherwise."""
    return release.split("+", 1)[0]


def assert_reproduces(path: Path) -> None:
    """The file fails, with an AssertionError that starts with the ID its header names.
    The file drives the pinned release's API: on another release (a hunt environment) it
    is not this release's reproduction, and the engine's `..._is_found_and_reproduces`
    tests write and run this release's own instead."""
    engine, want = header(path.read_text(encoding="utf-8"))
    documented, here = pinned(engine), installed(engine)
    if documented is not None and here is not None and _public(here) != _public(documented):
        pytest.skip(f"{path.name} was written on {engine} {documented}, whose API it calls; {engine} {here} is "
                    "installed (its own reproductions are written and run by the found-and-reproduces tests)")
    failure = run_reproduction(path)
    assert failure, f"{path.name} no longer fails: the engine may have fixed it"
    assert confirms(failure, want), f"{path.name} failed otherwise: {failure}"
