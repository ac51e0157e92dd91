"""Functions (and classes) of an adapter's preamble text, run without the engine: only the
named definitions are executed, in a namespace that stands in for the globals they read."""

from __future__ import annotations

import ast
from typing import Any


def functions_of(text: str, *names: str, **globals_: Any) -> dict[str, Any]:
    wanted: list[ast.stmt] = [n for n in ast.parse(text).body
                              if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in wanted if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert not missing, f"the preamble defines no {', '.join(sorted(missing))}"
    namespace: dict[str, Any] = dict(globals_)
    exec(compile(ast.Module(wanted, []), "<preamble>", "exec"), namespace)
    return namespace
