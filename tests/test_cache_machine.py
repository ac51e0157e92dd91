"""The reference cache survives the cache-level stateful machine."""

import re
import subprocess
import sys
from pathlib import Path

from oracle.cache_machine import CacheMachine

TestReferenceCache = CacheMachine.TestCase


MINE = """
from oracle.engines.reference_cache import ReferenceCache
from oracle.mutants import DoubleFreeAccepted


class Mine(ReferenceCache):
    name = "mine"
    cache_class = DoubleFreeAccepted
"""


def test_cli_runs_the_cache_machine_on_a_tiered_adapter(tmp_path: Path) -> None:
    """`kvoracle check --adapter` recognises a TieredAdapter and runs this machine on it."""
    (tmp_path / "mine.py").write_text(MINE, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "oracle.cli", "check", "--adapter", f"{tmp_path}/mine.py:Mine",
                           "--seeds", "1", "--examples", "100"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert re.search(r"^mine\s+cache\s.*\sFAIL\s+INV-CONSERVE\s", done.stdout, re.M), done.stdout
