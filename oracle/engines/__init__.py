"""Engine adapters, one module per engine. Importing an adapter module does not import
its engine: the engine is imported when the first adapter instance is made."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kvoracle.oracle.engine import REQUIRED_OPS, BadInput, EngineAdapter, Observation, Op, size_problem
from kvoracle.oracle.serving import SchedulerAdapter
from kvoracle.oracle.tiered import TieredAdapter


@dataclass(frozen=True)
class Engine:
    name: str
    module: str  # the adapter module
    adapter: str  # the adapter class
    requires: str  # the engine's top-level package
    venv: str  # where `make engines` installs it ("" for the reference)
    version: str


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("reference", "kvoracle.oracle.engines.reference", "ReferenceAdapter", "kvoracle.kvcache", "",
               "this tree"),
        Engine("vllm", "kvoracle.oracle.engines.vllm", "VllmAdapter", "vllm", ".venv-vllm", "0.34.0"),
        Engine("vllm-scheduler", "kvoracle.oracle.engines.vllm", "VllmSchedulerAdapter", "vllm", ".venv-vllm", "0.34.0"),
        Engine("sglang", "kvoracle.oracle.engines.sglang", "SglangAdapter", "sglang", ".venv-sglang", "0.5.23"),
        Engine("fastdeploy", "kvoracle.oracle.engines.fastdeploy", "FastDeployAdapter", "fastdeploy", "", "source"),
        Engine("fastdeploy-chunked", "kvoracle.oracle.engines.fastdeploy_chunked", "FastDeployChunked", "fastdeploy", "",
               "source"),
    )
}


class EngineUnavailable(Exception):
    """The engine is not importable in this Python."""


NEWER = "KVORACLE_NEWER_RELEASES"  # set to 1: drive a release newer than an adapter was checked on
_warned: set[tuple[str, str]] = set()  # (release, adapter): warned once per process


def require_release(engine: str, installed: tuple[int, ...], low: tuple[int, ...], high: tuple[int, ...],
                    adapter: str, absent_ok: bool = True,
                    spell: Callable[[tuple[int, ...]], str] | None = None) -> None:
    """Refuse, by name, an installed release outside those `adapter` drives: it calls the
    engine's internal APIs, which change between releases. An engine that is not installed
    passes here with `absent_ok` (the machine then says how to get it). A newer release
    is driven when KVORACLE_NEWER_RELEASES=1, with a warning: where its APIs moved, the
    campaign reports what the adapter's call raised (VALID-INPUT), not a verdict. `spell`
    writes a release as the engine names it (dotted numbers by default)."""
    name = spell or dotted
    if (installed or not absent_ok) and not low <= installed <= high:
        have, span = name(installed) or "not installed", f"{name(low)} .. {name(high)}"
        if installed > high and os.environ.get(NEWER) == "1":
            if (have, adapter) in _warned:
                return
            _warned.add((have, adapter))
            print(f"kvoracle: {engine} {have} is newer than {adapter} was checked on ({span}); driving it anyway "
                  f"({NEWER}=1): a failure that names the adapter's own call is a mismatch, not a finding",
                  file=sys.stderr)
            return
        newer = f"; to drive a newer release anyway, set {NEWER}=1" if installed > high else ""
        raise RuntimeError(f"{engine} {have}: {adapter} drives {engine} {span}{newer}")


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def adapter_class(name: str) -> type[EngineAdapter]:
    if name not in ENGINES:
        raise KeyError(f"no engine named {name!r}; known: {', '.join(ENGINES)}")
    e = ENGINES[name]
    if importlib.util.find_spec(e.requires) is None:
        raise EngineUnavailable(f"its package, {e.requires}, is not installed in this Python; "
                                f"{how_to_get(e)}")
    cls: type[EngineAdapter] = getattr(importlib.import_module(e.module), e.adapter)
    return cls


def how_to_get(e: Engine) -> str:
    """A release the engine's adapter drives, installed into this environment (the
    adapter's module does not import the engine), written as the engine spells it."""
    module = importlib.import_module(e.module)
    cls = getattr(module, e.adapter)
    releases: tuple[tuple[int, ...], tuple[int, ...]] | None = getattr(cls, "releases", None)
    if releases is None:
        return "install it here (docs/engines.md)"
    low, high = map(getattr(module, f"{e.requires}_release", dotted), releases)
    return (f"install a release {cls.__name__} drives into this environment (pip install "
            f"'{e.requires}>={low},<={high}'); from a kvoracle checkout, `make engines` builds {e.venv} with one")


def adapter_location(spec: str) -> tuple[str, str]:
    """The file or module and the class an adapter's name gives (ValueError, saying how
    to write it, where it gives neither)."""
    where, sep, cls_name = spec.rpartition(":")
    if not sep or not where or not cls_name or where.endswith(":"):
        raise ValueError(f"an adapter is named MODULE:CLASS or FILE.py:CLASS (one colon), not {spec!r}")
    if not where.endswith(".py") and ("/" in where or "\\" in where):
        raise ValueError(f"{where} is neither a file (name it with .py: {where}.py:{cls_name}) nor a module "
                         f"(dotted: {where.replace('/', '.').replace(chr(92), '.')}:{cls_name})")
    return where, cls_name


def load_adapter(spec: str) -> type:
    """Your own adapter: `package.module:Class` or `path/to/file.py:Class`."""
    where, cls_name = adapter_location(spec)
    module = file_module(Path(where)) if where.endswith(".py") else importlib.import_module(where)
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{where} has no class {cls_name}")
    if where.endswith(".py"):  # a reproduction finds it again by this, from anywhere
        setattr(cls, "kvoracle_source", f"{Path(where).resolve()}:{cls_name}")
    protocol_of(cls)  # raises, naming what is missing
    return cls


class NameTaken(ValueError):
    """A file that would be loaded under the name of a module of Python's own or already
    imported (not a file loaded here before): loading it would replace that module for everyone."""


def file_module(where: str | Path) -> ModuleType:
    """The module of a Python file, loaded once per process (an adapter's file, or a
    class of it that a reproduction builds its engine from)."""
    path = Path(where)
    if not path.is_file():
        raise ValueError(f"no file {path}")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
        return loaded
    stdlib = path.stem in sys.stdlib_module_names
    if stdlib or not (loaded is None or getattr(loaded, "kvoracle_file", False)):
        whose = "Python's own" if stdlib else "an imported"
        raise NameTaken(f"{path} would be loaded as the module {path.stem!r}, the name of {whose} module: "
                        "rename the file")
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # it may import the files beside it (last: none of them hides a module kvoracle uses)
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    setattr(module, "kvoracle_file", True)  # a reproduction loads it from the file too (oracle.engine.import_as)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _lacking(protocol: type, cls: type, name: str) -> str:
    """How `cls` lacks the Protocol's member `name` ('': it has it): a method of the
    Protocol must be one of the class too (`finish = None` is no finish)."""
    if not hasattr(cls, name):
        return name
    have = getattr(cls, name)
    if callable(getattr(protocol, name, None)) and not callable(have):
        return f"{name} (a {type(have).__name__}, not a method)"
    return ""


def _members(protocol: type, cls: type) -> set[str]:
    optional = set()
    if protocol is EngineAdapter:  # assertions and the per-operation methods may be left out
        optional = {"prefill", "grow", "evict", "assertions"} | (set() if getattr(cls, "bad_inputs", None) else {"bad_input"})
    return {n for n in [*vars(protocol), *protocol.__annotations__] if not n.startswith("_")} - optional


PROTOCOLS: dict[str, type] = {"engine": EngineAdapter, "cache": TieredAdapter, "scheduler": SchedulerAdapter}


def protocol_of(cls: type) -> str:
    """Which adapter Protocol `cls` implements: "engine" (oracle.engine, the engine
    machine), "cache" (oracle.tiered, the cache machine) or "scheduler" (oracle.serving,
    the scheduler machine)."""
    missing = {level: sorted(filter(None, (_lacking(p, cls, n) for n in _members(p, cls))))
               for level, p in PROTOCOLS.items()}
    for level, lacks in missing.items():
        if not lacks:
            if level == "engine":
                _check_declarations(cls)
            return level
    level, lacks = min(missing.items(), key=lambda kv: len(kv[1]))
    raise ValueError(f"{cls.__name__} lacks {', '.join(lacks)} of the {PROTOCOLS[level].__name__} "
                     f"Protocol (the closest of {', '.join(p.__name__ for p in PROTOCOLS.values())})")


def _check_declarations(cls: type) -> None:
    """What an engine adapter declares, checked before any campaign: a mistake here would
    otherwise surface as a finding against the engine."""
    name, size, ops, bad = (getattr(cls, n) for n in ("name", "block_size", "operations", "bad_inputs"))
    wrong = []
    if not isinstance(name, str) or not name:
        wrong.append(f"name must be a non-empty str, not {name!r}")
    if problem := size_problem("block_size", size, 1):
        wrong.append(problem)
    if not isinstance(ops, (set, frozenset)) or not all(isinstance(op, Op) for op in ops):
        wrong.append(f"operations must be a frozenset (or set) of Op members (Op.ADMIT, ...), not {ops!r}")
    else:
        needed = [op.value for op in REQUIRED_OPS if op not in ops]
        if needed:
            wrong.append(f"operations must include {', '.join(f'Op.{v.upper()}' for v in needed)}")
        wrong += [f"operations declares Op.{op.name} but the class has no {op.value}()" for op in sorted(
            ops, key=lambda o: o.value) if not hasattr(cls, op.value)]
    if not isinstance(bad, (set, frozenset)) or not all(isinstance(b, BadInput) for b in bad):
        wrong.append(f"bad_inputs must be a frozenset (or set) of BadInput members, not {bad!r}")
    if wrong:
        raise ValueError(f"{cls.__name__}: {'; '.join(wrong)}")
