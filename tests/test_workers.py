"""Campaigns on several processes and on a Ray cluster: the same rows, in the same order,
with the same shrunk counterexamples, wherever they ran."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvoracle.oracle.cli import main
from kvoracle.oracle.workers import LOCAL, ClusterUnavailable, in_order, session

ray_installed = importlib.util.find_spec("ray") is not None


def square(x: int) -> int:
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_back_in_order(workers: int) -> None:
    assert list(in_order(square, list(range(7)), workers)) == [x * x for x in range(7)]


def test_without_ray_a_cluster_run_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(ClusterUnavailable, match=r"pip install 'kvoracle\[ray\]'"):
        list(in_order(square, [1], ray=LOCAL))


@pytest.mark.skipif(not ray_installed, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_an_address_where_no_cluster_listens_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--level", "cache", "--seeds", "1", "--examples", "5", "--no-coverage",
                 "--ray", "127.0.0.1:9"]) == 2
    assert "no Ray cluster at '127.0.0.1:9'" in capsys.readouterr().err


def test_engine_campaigns_refuse_workers_and_ray(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--engine", "reference", "--ray", LOCAL]) == 2
    assert "--ray: not for adapters of the engine level" in capsys.readouterr().err


def rows(tmp_path: Path, *where: str, mutant: str = "double-unlock") -> list[dict[str, object]]:
    """The rows of `kvoracle check` run in a process of its own: Hypothesis mixes the
    constants of every loaded local module into its draws, so a campaign run inside this
    test process (which has the whole test suite loaded) would draw differently."""
    out = tmp_path / f"rows{'_'.join(where)}.json"
    done = subprocess.run([sys.executable, "-m", "kvoracle.oracle.cli", "check", "--mutant", mutant, "--seeds", "1",
                           "--examples", "30", "--no-coverage", "--json", str(out), *where],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found: list[dict[str, object]] = json.loads(out.read_text())
    for row in found:
        row.pop("seconds")
    return found


@pytest.mark.skipif(not ray_installed, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_a_campaign_on_a_local_ray_cluster_gives_the_same_rows(tmp_path: Path) -> None:
    here = rows(tmp_path)
    assert [r["verdict"] for r in here] == ["pass", "pass", "caught"] and here[-1]["counterexample"]  # 2 reference rows
    assert rows(tmp_path, "--ray", LOCAL) == here
    assert rows(tmp_path, "--workers", "2") == here


@pytest.mark.skipif(not ray_installed, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_the_campaign_options_reach_the_ray_workers(tmp_path: Path) -> None:
    """A Ray worker is a fresh process: the fault rate must travel with each target."""
    on_ray = rows(tmp_path, "--fault-rate", "0", "--ray", LOCAL, mutant="leaky-admit")
    assert [r["faults"] for r in on_ray] == [0, 0, 0]
    assert on_ray == rows(tmp_path, "--fault-rate", "0", mutant="leaky-admit")


@pytest.mark.parametrize(("given", "env", "says"), [
    (["--fault-rate", "2"], {}, "--fault-rate must be in [0, 1], got 2.0"),
    (["--fault-rate", "0.9", "--audit-every", "0"], {}, "--audit-every"),
    (["--audit-every", "5", "--fault-rate", "2"], {}, "--fault-rate"),
    (["--audit-every", "5", "--kv-backend", "cupy"], {}, "cupy"),
    (["--audit-every", "0"], {}, "--audit-every: the audit interval must be at least 1 step, not 0"),
    (["--fault-rate", "0.9"], {"KV_BACKEND": "tensorflow"}, "unknown KV backend 'tensorflow'"),
])
def test_unusable_campaign_settings_are_refused_and_nothing_is_set(
        given: list[str], env: dict[str, str], says: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings every worker applies again (Settings.apply) are checked once, up front:
    exit 2 with the reason, and the fault rate and audit interval this process had stand."""
    from kvoracle.oracle import audit
    from kvoracle.oracle.scheduler_machine import FAULT_RATE

    if "cupy" in given and importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed here: the backend is usable")
    monkeypatch.delenv("KV_BACKEND", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = (FAULT_RATE[0], audit.EVERY[0], os.environ.get("KV_BACKEND"))
    assert main(["check", "--level", "cache", "--no-coverage", *given]) == 2
    assert says in capsys.readouterr().err
    assert (FAULT_RATE[0], audit.EVERY[0], os.environ.get("KV_BACKEND")) == before


def makes_a_temporary_directory(name: str) -> str:
    where = tempfile.mkdtemp(prefix=name)
    Path(where, "block").write_bytes(b"kv")
    return where


def test_what_a_piece_leaves_in_its_temporary_directory_on_a_ray_worker_goes_when_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray ends its workers without running their finalizers (the disk row's Disk
    # directories stayed in /tmp): each piece's temporary files go when it answers.
    from kvoracle.oracle.workers import _in_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    where = _in_scratch(makes_a_temporary_directory, "kvoracle-disk-")
    assert tempfile.tempdir == str(tmp_path)
    assert Path(where).parent.parent == tmp_path and not Path(where).exists()
    assert list(tmp_path.iterdir()) == []


def test_a_ray_piece_removes_the_directories_of_killed_workers_and_keeps_live_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker Ray kills mid-piece leaves its directory: the next piece on the machine
    # removes it, and leaves alone those of workers still running.
    from kvoracle.oracle.workers import SCRATCH, _in_scratch

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no process holds now
    dead = tmp_path / f"{SCRATCH}{child.pid}-x1"
    live = tmp_path / f"{SCRATCH}{os.getpid()}-x2"
    other = tmp_path / "kvoracle-disk-x3"
    for folder in (dead, live, other):
        (folder / "sub").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _in_scratch(makes_a_temporary_directory, "kvoracle-disk-")
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.skipif(not ray_installed, reason="Ray is not installed (pip install 'kvoracle[ray]')")
def test_one_session_serves_every_search_of_a_run_and_ends_with_it() -> None:
    """`kvoracle prove --ray local` starts one cluster, not one per search."""
    import ray
    with session(LOCAL):
        assert ray.is_initialized()
        node = ray.get_runtime_context().get_node_id()
        assert list(in_order(abs, [-2, 3], ray=LOCAL)) == [2, 3]  # (a Ray worker cannot import this file)
        assert ray.is_initialized() and ray.get_runtime_context().get_node_id() == node  # not shut down between
        assert list(in_order(abs, [-4], ray=LOCAL)) == [4]
    assert not ray.is_initialized()
    with session(None):
        assert not ray.is_initialized()
