"""docs/shadow.md's snippet that builds a vLLM KVCacheManager to try shadow mode on runs
as written (in .venv-vllm: `.venv-vllm/bin/pytest tests/test_shadow_docs.py`; skipped
where vLLM is not installed), and says what attach takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHADOW_MD = ROOT / "docs" / "shadow.md"
BAD_LINE = "# mgr.block_pool.free_blocks("


def snippet() -> str:
    """The python block after "To try it on vLLM"."""
    text = SHADOW_MD.read_text()
    start = re.search(r"To try it\s+on vLLM", text)
    assert start is not None, "docs/shadow.md: no 'To try it on vLLM'"
    found = re.search(r"```python\n(.*?)```", text[start.end():], re.S)
    assert found is not None, "docs/shadow.md: no python block after 'To try it on vLLM'"
    return found.group(1)


def test_the_snippet_is_there_and_attaches_to_the_manager() -> None:
    code = snippet()
    assert 'kvoracle.shadow.attach(mgr, engine="vllm")' in code and BAD_LINE in code
    assert "hit, hit_tokens, _ = mgr.get_computed_blocks(req)" in code  # three values from 0.26


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "try_shadow.py"
    path.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "KVORACLE_SHADOW_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)


def test_the_snippet_runs_on_the_installed_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from kvoracle.oracle.engines.vllm import PREFIX_BOUNDARY_FROM, installed

    if installed() < PREFIX_BOUNDARY_FROM:  # the page says so, and what differs before
        pytest.skip(f"the snippet is written for vLLM 0.26 and later (get_computed_blocks' three values); "
                    f"{'.'.join(map(str, installed()))} is installed")
    clean = run(snippet(), tmp_path)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "kvoracle shadow (vllm): 1 engine object(s), 3 calls" in clean.stdout and "0 alarm(s)" in clean.stdout
    pool = run(snippet() + "try:\n    kvoracle.shadow.attach(mgr.block_pool, engine='vllm')\n"
                           "except TypeError as e:\n    print('refused:', e)\n", tmp_path)
    assert "refused: the vllm observer cannot attach to this BlockPool object" in pool.stdout, pool.stderr[-3000:]
    assert "it attaches to vllm.v1.core.kv_cache_manager:KVCacheManager" in pool.stdout
    bad = run(snippet().replace(BAD_LINE, BAD_LINE[2:]), tmp_path)
    assert bad.returncode != 0 and "ShadowAlarm" in bad.stderr, bad.stderr[-3000:]
    assert re.search(r"INV-NO-UAF: request r0 lists GPU block \d+, which is on the free list", bad.stderr)
