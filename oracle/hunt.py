"""`kvoracle hunt`: the known-bugs benchmark. Real, publicly fixed block-lifecycle bugs of
released engines, listed in engines/hunt.toml; for each, the campaign runs against the
release that has the bug (it must be caught, with the property expected) and against
the first release with the fix (it must pass: no false alarm). Each release runs in an
environment of its own under .venv-hunt/, built on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvoracle.oracle.campaign import GENERATORS
from kvoracle.oracle.report import columns

ROOT = Path(__file__).resolve().parent.parent  # the repository (hunt runs from a checkout)
CATALOGUE = ROOT / "engines" / "hunt.toml"
ENVIRONMENTS = ROOT / ".venv-hunt"
PINS = ROOT / "engines" / "hunt"


class CatalogueError(Exception):
    """engines/hunt.toml is malformed; names the entry and the field."""


class BuildError(Exception):
    """A release's environment could not be built; carries pip's error output."""


@dataclass(frozen=True)
class KnownBug:
    name: str
    engine: str  # the PyPI distribution
    what: str  # the bug, in a sentence
    public: str  # where it is described: "SGLang issue 13483, PR 13501"
    buggy: str  # a PyPI release that has it
    fixed: str  # the first release with the fix ("" when none has it: a catch-only row)
    adapter: str  # MODULE:CLASS, with the options that steer the campaign to the bug's path
    expect: tuple[str, ...]  # property IDs whose violation counts as catching it
    seeds: int = 3
    examples: int = 150
    note: str = ""  # why a row cannot be run, or what to know when reading it
    known: tuple[str, ...] = ()  # ID[:STEP] of other bugs both releases have (check --expect): gone past
    generator: str = "hypothesis"  # who draws the programs (check --generator; `hunt --generator` overrides it)


def load(path: Path = CATALOGUE) -> list[KnownBug]:
    """The catalogue, validated."""
    with path.open("rb") as f:
        entries = tomllib.load(f).get("bug", [])
    out = []
    for i, e in enumerate(entries):
        missing = [k for k in ("name", "engine", "what", "public", "buggy", "adapter", "expect") if k not in e]
        if missing:
            raise CatalogueError(f"{path.name}: bug {i + 1} ({e.get('name', '?')}) lacks {', '.join(missing)}")
        out.append(KnownBug(e["name"], e["engine"], e["what"], e["public"], e["buggy"], e.get("fixed", ""),
                            e["adapter"], tuple(e["expect"]), e.get("seeds", 3), e.get("examples", 150),
                            e.get("note", ""), tuple(e.get("known", ())), e.get("generator", "hypothesis")))
        if out[-1].generator not in GENERATORS:
            raise CatalogueError(f"{path.name}: bug {i + 1} ({e['name']}): no generator {out[-1].generator!r} "
                                 f"(one of {', '.join(GENERATORS)})")
    return out


# --- environments -------------------------------------------------------------------------------


@dataclass
class Builder:
    """Builds .venv-hunt/<engine>-<version>: the engine release with --no-deps, the pins of
    engines/hunt/<engine>-<version>.txt, and kvoracle's wheel, over one shared base
    environment that holds torch (CPU) and triton (a .pth file links the two), so that
    ten releases do not cost ten copies of torch."""

    python: str = sys.executable
    say: Callable[[str], None] = lambda _: None
    built: dict[str, float] = field(default_factory=dict)  # environment -> seconds to build

    def base(self) -> Path:
        base = ENVIRONMENTS / "base"
        if not (base / ".installed").exists():
            self.say("building .venv-hunt/base (torch 2.13.0 CPU, triton)")
            self._venv(base)
            self._pip(base, "-c", str(ROOT / "engines" / "torch.txt"), "torch==2.13.0+cpu", "triton==3.9.0")
            (base / ".installed").touch()
        return base

    def environment(self, engine: str, version: str, wheel: Path) -> Path:
        env = ENVIRONMENTS / f"{engine}-{version}"
        pins = PINS / f"{engine}-{version}.txt"
        if not pins.exists():
            raise CatalogueError(f"no pin list {pins.relative_to(ROOT)} for {engine} {version}")
        stamp = env / ".installed"
        if not stamp.exists() or stamp.stat().st_mtime < pins.stat().st_mtime:
            start = time.perf_counter()
            self.say(f"building .venv-hunt/{env.name}")
            self._venv(env)
            site = _site_packages(env)
            (site / "kvoracle_hunt_base.pth").write_text(str(_site_packages(self.base())) + "\n")
            self._pip(env, "--no-deps", f"{engine}=={version}")
            self._pip(env, "--no-deps", "-r", str(pins))
            stamp.touch()
            self.built[env.name] = time.perf_counter() - start
        self._pip(env, "--no-deps", "--force-reinstall", str(wheel))
        return env

    def _venv(self, env: Path) -> None:
        subprocess.run([self.python, "-m", "venv", "--clear", str(env)], check=True)

    def _pip(self, env: Path, *args: str) -> None:
        # pip's output (warnings about the machine's own pip.conf among it) only when it fails
        done = subprocess.run([str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *args],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"pip install {' '.join(args)} in {env.name} failed:\n{done.stderr[-2000:]}")


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def wheel() -> Path:
    """kvoracle's wheel, built from this checkout (the environments install it as users do)."""
    out = ROOT / "out" / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "-w", str(out), str(ROOT)], check=True)
    return max(out.glob("kvoracle-*.whl"), key=lambda p: p.stat().st_mtime)


# --- running ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One campaign on one release."""

    version: str
    verdict: str  # "pass", "VIOLATION", or "ERROR" (the campaign could not run)
    first_id: str = ""
    shrunk: int | None = None
    first_catch: int | None = None
    steps: int = 0
    faults: int = 0  # faults injected (a pass means more with more of them)
    seconds: float = 0.0
    detail: str = ""


def campaign(env: Path, bug: KnownBug, version: str, out: Path, generator: str = "hypothesis") -> Outcome:
    """`kvoracle check --adapter` in the release's environment, from outside the checkout."""
    report = out / f"{bug.name}-{version}.json"
    cmd = [str(env / "bin" / "kvoracle"), "check", "--adapter", bug.adapter, "--seeds", str(bug.seeds),
           "--examples", str(bug.examples), "--json", str(report), "--no-coverage", "--generator", generator,
           *(f"--expect={k}" for k in bug.known)]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    seconds = time.perf_counter() - start
    if not report.exists():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome(version, "ERROR", seconds=seconds, detail=tail)
    row = json.loads(report.read_text())[0]
    verdict = "pass" if row["verdict"] == "pass" else "VIOLATION"
    return Outcome(version, verdict, row["first_id"], row["shrunk"], row["first_catch"], row["steps"],
                   row["faults"], seconds, row["violation"] or "")


def caught(bug: KnownBug, o: Outcome) -> bool:
    return o.verdict == "VIOLATION" and o.first_id in bug.expect


def table(rows: Sequence[tuple[KnownBug, Outcome, Outcome | None]]) -> str:
    head = ("bug", "engine", "buggy -> fixed", "caught?", "first ID", "shrunk", "first catch", "time",
            "fixed passes?")
    body = []
    for bug, b, f in rows:
        fixed = "-" if f is None else (f"yes ({f.steps} steps, {f.faults} faults)" if f.verdict == "pass"
                                       else f"NO ({f.first_id or f.verdict})")
        body.append((bug.name, bug.engine, f"{bug.buggy} -> {bug.fixed or '(none)'}",
                     "yes" if caught(bug, b) else f"NO ({b.verdict})", b.first_id or "-",
                     "-" if b.shrunk is None else str(b.shrunk),
                     "-" if b.first_catch is None else f"{b.first_catch} steps",
                     f"{b.seconds + (f.seconds if f else 0):.0f}s", fixed))
    return columns(head, body)


def _run(builder: Builder, bug: KnownBug, version: str, built: Path, out: Path,
         say: Callable[[str], None], generator: str) -> Outcome:
    """One release: its environment (a failed build is that row's error, not the hunt's end)
    and the campaign."""
    say(f"{bug.name}: {bug.engine} {version}")
    try:
        env = builder.environment(bug.engine, version, built)
    except BuildError as e:
        return Outcome(version, "ERROR", detail=str(e).splitlines()[0])
    return campaign(env, bug, version, out, generator)


def hunt(only: Sequence[str] = (), say: Callable[[str], None] = lambda _: None,
         generator: str | None = None) -> tuple[str, bool]:
    """Run every row (or those named), each campaign's programs drawn by `generator`
    (None: the row's own); the table, and whether every row was as expected."""
    bugs = [b for b in load() if not only or b.name in only]
    unknown = set(only) - {b.name for b in bugs}
    if unknown:
        raise CatalogueError(f"no bug named {', '.join(sorted(unknown))} in {CATALOGUE.name}")
    out = ROOT / "out" / "hunt"
    out.mkdir(parents=True, exist_ok=True)
    builder, built = Builder(say=say), wheel()
    rows: list[tuple[KnownBug, Outcome, Outcome | None]] = []
    for bug in bugs:
        drawn_by = generator or bug.generator
        b = _run(builder, bug, bug.buggy, built, out, say, drawn_by)
        f = _run(builder, bug, bug.fixed, built, out, say, drawn_by) if bug.fixed else None
        rows.append((bug, b, f))
        say(f"{bug.name}: {'caught' if caught(bug, b) else 'NOT caught'} ({b.first_id or b.verdict})"
            + ("" if f is None else f"; fixed release: {f.verdict} {f.first_id}".rstrip()))
    ok = all(caught(bug, b) and (f is None or f.verdict == "pass") for bug, b, f in rows)
    notes = [f"{bug.name}: {x.version}: {x.detail}" for bug, b, f in rows for x in (b, f)
             if x is not None and x.verdict == "ERROR"]
    text = table(rows) + "".join(f"\n  {n}" for n in notes)
    if builder.built:
        text += "\n\nenvironments built: " + ", ".join(f"{k} {v:.0f}s" for k, v in builder.built.items())
    return text, ok
