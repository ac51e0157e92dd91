"""Spec's frozen dataclasses rewritten for mypyc: each gets its `__init__`, `__eq__` and
`__hash__` written out, and a `__copy__` and a `__reduce__`, which mypyc compiles to native code.

The methods that `dataclasses` generates are Python code made at import time, so mypyc
cannot compile them: compiled, every state the search built still ran an interpreted
frame per object, and a frozen class's `__init__` sets each field through
`object.__setattr__`; every comparison of two heaps or two states ran one too. That was
the largest cost of the compiled search after the objects themselves. Here, in the
build's copy of the sources only (proofs/compiled.py), each `@dataclass(frozen=True)`
class becomes `@dataclass(init=False, eq=False)` with those methods written out: the
same fields in the same order, the same defaults, the same equality and the same hash;
`spec.frozen.replace` copies with `__copy__`. What `frozen` adds is a guarantee that mypy
already checks on the sources, where the classes stay frozen.
"""

from __future__ import annotations

import ast


def with_native_methods(source: str) -> str:
    """`source` with every frozen dataclass given written-out methods: the text is
    spliced, not regenerated, so comments (mypy's `type: ignore`s among them) stay."""
    lines = source.splitlines(keepends=True)
    classes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]
    for node in sorted(classes, key=lambda n: n.lineno, reverse=True):  # bottom up: earlier lines keep their numbers
        decorator = _frozen_dataclass(node)
        if decorator is None:
            continue
        indent = " " * node.body[0].col_offset
        fields = _fields(node)
        methods = "\n\n".join(m.strip("\n") for m in (_init(fields), _copy(node.name, fields), _reduce(node.name, fields),
                                                       _equality(node.name, fields)))
        assert node.end_lineno is not None and decorator.end_lineno is not None
        lines.insert(node.end_lineno, "\n" + "".join(f"{indent}{line}\n" if line else "\n" for line in methods.splitlines()))
        keywords = [ast.unparse(k) for k in decorator.keywords if k.arg != "frozen"]
        head = lines[decorator.lineno - 1][: decorator.col_offset]
        tail = lines[decorator.end_lineno - 1][decorator.end_col_offset:]
        lines[decorator.lineno - 1: decorator.end_lineno] = [
            f"{head}dataclass({', '.join([*keywords, 'init=False', 'eq=False'])}){tail}"]
    return "".join(lines)


def _frozen_dataclass(node: ast.ClassDef) -> ast.Call | None:
    for d in node.decorator_list:
        if (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "dataclass"
                and any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in d.keywords)):
            if node.bases:  # a dataclass base's fields would come first: none in spec/
                raise ValueError(f"class {node.name}: frozen dataclasses with bases are not rewritten")
            return d
    return None


Field = tuple[str, ast.expr, ast.expr | None]  # name, annotation, default as written


def _fields(node: ast.ClassDef) -> list[Field]:
    return [(s.target.id, s.annotation, s.value) for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and not _class_var(s.annotation)]


def _class_var(annotation: ast.expr) -> bool:
    head = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return isinstance(head, ast.Name | ast.Attribute) and ast.unparse(head).endswith("ClassVar")


def _init(fields: list[Field]) -> str:
    """def __init__(self, <field>: <annotation> = <default>, ...) -> None: self.<field> = ..."""
    params, body = ["self"], []
    for name, annotation, default in fields:
        factory = _factory(default)
        if factory is not None:  # field(default_factory=f): None stands for "make a new one"
            params.append(f"{name}: {ast.unparse(annotation)} | None = None")
            body.append(f"self.{name} = {ast.unparse(factory)}() if {name} is None else {name}")
            continue
        written = "" if default is None else f" = {ast.unparse(_plain_default(name, default))}"
        params.append(f"{name}: {ast.unparse(annotation)}{written}")
        body.append(f"self.{name} = {name}")
    return f"def __init__({', '.join(params)}) -> None:\n" + "".join(f"    {line}\n" for line in body or ["pass"])


def _copy(cls: str, fields: list[Field]) -> str:
    """A native `__copy__` (spec.frozen.replace copies, then sets the changed fields)."""
    values = ", ".join(f"self.{name}" for name, _, _ in fields)
    return f"def __copy__(self) -> {cls}:\n    return {cls}({values})"


def _reduce(cls: str, fields: list[Field]) -> str:
    """A native `__reduce__`: pickle (the frontier's spilled chunks, the partitions'
    arrivals) takes an instance apart in compiled code, not through a Python function."""
    values = "".join(f"self.{name}, " for name, _, _ in fields)
    return f"def __reduce__(self) -> tuple[type[{cls}], tuple[object, ...]]:\n    return ({cls}, ({values}))"


def _equality(cls: str, fields: list[Field]) -> str:
    """`__eq__` and `__hash__` as dataclasses writes them for a frozen class: the fields as
    a tuple, compared only with an instance of the very same class."""
    mine = "".join(f"self.{name}, " for name, _, _ in fields)
    theirs = "".join(f"other.{name}, " for name, _, _ in fields)
    return (f"def __eq__(self, other: object) -> bool:\n"
            f"    if type(other) is not type(self) or not isinstance(other, {cls}):\n"
            f"        return NotImplemented\n"
            f"    return ({mine}) == ({theirs})\n\n"
            f"def __hash__(self) -> int:\n"
            f"    return hash(({mine}))\n")


def _factory(default: ast.expr | None) -> ast.expr | None:
    if isinstance(default, ast.Call) and isinstance(default.func, ast.Name) and default.func.id == "field":
        for k in default.keywords:
            if k.arg == "default_factory":
                return k.value
    return None


def _plain_default(name: str, default: ast.expr) -> ast.expr:
    if isinstance(default, ast.Call) and isinstance(default.func, ast.Name) and default.func.id == "field":
        for k in default.keywords:
            if k.arg == "default":
                return k.value
        raise ValueError(f"field {name}: only field(default=...) and field(default_factory=...) are rewritten")
    return default
