"""An engine's own test file that runs kvoracle's request-level machine on its adapter.

Copy it next to your tests; with kvoracle installed (its wheel: README, "Installing it"), `pytest`
collects TestToyEngine like any other TestCase. docs/engines.md, "In your own test suite".
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import settings

import kvoracle.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # where toy_engine.py lives
from toy_engine import ToyAdapter  # noqa: E402

# The toy engine has a planted bug: this TestCase fails with INV-NO-UAF (see docs/engines.md).
TestToyEngine = kvoracle.testing.engine_machine(ToyAdapter, settings=settings(max_examples=100, deadline=None)).TestCase
