"""The model checker compiled by mypyc: the same search, 1.6 to 2.5 times the states
per second of the interpreted one (`make bench` prints both, side by side).

mypyc (it ships with mypy, the dev extra) compiles spec/, proofs/model_check.py and
proofs/frontier.py, code mypy --strict already checks, to C extensions; it needs a C
compiler. `build` does that once per version of the sources, in a copy of the kvoracle
package under the cache directory ($KVORACLE_CACHE, else $XDG_CACHE_HOME/kvoracle, else
~/.cache/kvoracle), and `search` runs one model check in a child process that imports that copy: the state
space, the checks and the counterexamples are those of the interpreted search
(tests/test_compiled.py compares them). CrossHair and the machines keep using the
interpreted spec/: only the searches run compiled.

    kvoracle prove --compiled        # or Search(compiled=True) in proofs/obligations.py
"""

from __future__ import annotations

import copyreg
import hashlib
import importlib
import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import astuple
from pathlib import Path
from typing import Any, BinaryIO

import kvoracle
from kvoracle.proofs.model_check import Report, explore
from kvoracle.proofs.native import with_native_methods
from kvoracle.proofs.partitioned import explore_partitioned
from kvoracle.spec.next import Scope

COMPILED = ("spec/*.py", "proofs/model_check.py", "proofs/frontier.py")  # relative to the package
_DONE = "BUILT"  # the marker of a finished build in its directory
KEEP = 3  # finished builds kept in the cache (older versions of the sources are removed)


class CompileError(RuntimeError):
    """The compiled model checker could not be built or started (the message says why)."""


def cache_root() -> Path:
    base = os.environ.get("KVORACLE_CACHE") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                                   / "kvoracle")
    return Path(base) / "compiled"


def _package() -> Path:
    return Path(kvoracle.__file__).resolve().parent


def _sources(package: Path) -> list[Path]:
    """The package's files (its subpackages' links followed), relative to it, sorted."""
    found = []
    for folder, dirs, files in os.walk(package, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder, f).relative_to(package) for f in files if f.endswith(".py") or f == "py.typed"]
    return sorted(found)


def _key(package: Path, files: list[Path]) -> str:
    """What a build depends on: every source's path and bytes, Python's version, mypy's."""
    import mypy.version

    return _digest(package, files, f"{sys.version}\0{mypy.version.__version__}\0")


def _digest(package: Path, files: list[Path], head: str = "") -> str:
    digest = hashlib.sha256(head.encode())
    for f in files:
        digest.update(f"{f}\0".encode() + (package / f).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def sources_digest() -> str:
    """16 hex digits naming the package's sources (every file's path and bytes): two
    builds of one version with different code have different digests."""
    package = _package()
    return _digest(package, _sources(package))


def build(say: Callable[[str], None] = lambda _: None) -> Path:
    """The directory holding the compiled copy of the package (built now if it is not
    there yet): a child process with it first on PYTHONPATH imports the compiled search."""
    if importlib.util.find_spec("mypyc") is None:
        raise CompileError("mypyc is not installed: it ships with mypy (pip install 'kvoracle[prove]')")
    package = _package()
    files = _sources(package)
    root = cache_root() / _key(package, files)
    if (root / _DONE).exists():
        return root
    say(f"compiling spec/ and the model checker with mypyc into {root} (once per version of the sources)")
    work = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    for f in files:
        (work / "kvoracle" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / f, work / "kvoracle" / f)
    targets = sorted(str(p.relative_to(work)) for pattern in COMPILED for p in (work / "kvoracle").glob(pattern))
    for target in targets:  # native dataclass methods; the sources keep their frozen dataclasses
        (work / target).write_text(with_native_methods((work / target).read_text()))
    # a config of its own: mypy would otherwise look for one in the folders above the cache
    # (a project's pyproject.toml, perhaps this repository's, which holds COMPILING false)
    (work / "mypy.ini").write_text("[mypy]\n")
    done = subprocess.run([sys.executable, "-m", "mypyc", "--config-file", "mypy.ini", "--always-true", "COMPILING",
                           *targets], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        shutil.rmtree(work, ignore_errors=True)
        raise CompileError(f"mypyc failed (exit {done.returncode}); the end of its output:\n{tail}")
    shutil.rmtree(work / "build", ignore_errors=True)  # the generated C: not needed to run
    (work / _DONE).write_text("\n".join(targets) + "\n")
    try:
        work.rename(root)
    except OSError:  # another process finished the same build first
        shutil.rmtree(work, ignore_errors=True)
    _prune(root.parent, KEEP)
    return root


def _prune(builds: Path, keep: int) -> None:
    """Remove all but the `keep` newest finished builds (about 6 MB each)."""
    done = sorted((d for d in builds.iterdir() if (d / _DONE).exists()), key=lambda d: (d / _DONE).stat().st_mtime)
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def search(scope: Scope, mutation: str = "", max_states: int = 2_000_000, partitions: int = 1,
           progress: Callable[[int, int], None] | None = None, say: Callable[[str], None] = lambda _: None) -> Report:
    """proofs.model_check.explore (partitions 1) or proofs.partitioned.explore_partitioned,
    run compiled in a child process; its Report."""
    root = build(say)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-m", "kvoracle.proofs.compiled"], cwd=root, env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    with child:
        # the scope as its fields: a compiled Scope cannot be unpickled from an interpreted one's state
        pickle.dump((str(root), astuple(scope), mutation, max_states, partitions), child.stdin)
        child.stdin.close()
        while True:
            try:
                what, *value = pickle.load(child.stdout)
            except EOFError:
                raise CompileError(f"the compiled search ended without a report (exit {child.wait()}; "
                                   "its error is above)") from None
            if what == "progress" and progress is not None:
                progress(*value)
            elif what == "report":
                report: Report = value[0]
                return report


def _reduce(obj: object) -> tuple[type, tuple[Any, ...]]:
    """How pickle takes apart a compiled dataclass (no __dict__, a frozen __setattr__):
    its class and its fields, for the compiled __init__ to put back together."""
    from kvoracle.spec.frozen import field_names

    names = field_names(type(obj)) or ()
    return type(obj), tuple(getattr(obj, n) for n in names)


def _pickle_compiled_classes(root: Path) -> None:
    """Check that the compiled modules are the ones imported, and let pickle take apart
    their dataclasses that have no `__reduce__` of their own (proofs/native.py writes one
    for each frozen one; the frontier and the partitions pickle states)."""
    from dataclasses import is_dataclass

    from kvoracle.spec.frozen import field_names

    for target in (root / _DONE).read_text().split():
        module = importlib.import_module(target.removesuffix(".py").replace("/", "."))
        if str(module.__file__).endswith(".py"):
            raise CompileError(f"{module.__name__} was imported from its source, not compiled: {module.__file__}")
        for value in vars(module).values():
            if (isinstance(value, type) and is_dataclass(value) and field_names(value) is not None
                    and "__reduce__" not in vars(value)):
                copyreg.pickle(value, _reduce)


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The child: one search, its progress and its report sent back as pickles."""
    root, fields, mutation, max_states, partitions = pickle.load(requests)
    scope = Scope(*fields)
    if not kvoracle.__file__ or not Path(kvoracle.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise CompileError(f"the child imported kvoracle from {kvoracle.__file__}, not from the build at {root}")
    _pickle_compiled_classes(Path(root))

    def progress(states: int, queued: int) -> None:
        pickle.dump(("progress", states, queued), answers)
        answers.flush()

    if partitions > 1:
        report = explore_partitioned(scope, mutation, max_states, partitions, None, progress)
    else:
        report = explore(scope, mutation, max_states, progress)
    pickle.dump(("report", report), answers)
    answers.flush()


if __name__ == "__main__":
    answers = sys.stdout.buffer
    sys.stdout = sys.stderr  # only pickles on the pipe
    _serve(sys.stdin.buffer, answers)
