"""`replace`: a copy of one of spec's frozen dataclasses with some fields changed.

It means `dataclasses.replace`, and the type checker sees that function (so a misspelt
or mistyped field is an error there; at run time nothing checks the names, which is
why mypy --strict runs over every package). At run time it copies the fields
without calling `__init__` again: the actions build several states per step, and
`dataclasses.replace` (field lookup, keyword call, a frozen `__setattr__` per field)
was the model checker's largest cost. Spec's dataclasses have no `__post_init__`, no
`init=False` fields and no `__slots__`, which is what makes the copy equivalent.

Compiled by mypyc (`kvoracle prove --compiled`, proofs/compiled.py), spec's classes are
native: their instances have no `__dict__`, and the build gives each a compiled `__init__`
and `__copy__` and drops `frozen` (proofs/native.py), so the copy is the class's own
`__copy__` and the changed fields are then set.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, TypeVar

T = TypeVar("T")

# per class: None when its instances keep their fields in __dict__ (plain Python),
# else its field names in __init__'s order (a class compiled by mypyc)
_NATIVE_FIELDS: dict[type, tuple[str, ...] | None] = {}


def field_names(cls: type) -> tuple[str, ...] | None:
    """cls's field names if its instances have no __dict__ (mypyc-native), else None."""
    try:
        return _NATIVE_FIELDS[cls]
    except KeyError:
        names = None if "__dict__" in dir(cls) else tuple(f.name for f in fields(cls))
        _NATIVE_FIELDS[cls] = names
        return names


def _copy_with(obj: T, /, **changes: object) -> T:
    cls = type(obj)
    names = field_names(cls)
    if names is not None:
        copied: T = getattr(obj, "__copy__")()  # written out for the build (proofs/native.py)
        for name, value in changes.items():
            setattr(copied, name, value)
        return copied
    new: T = object.__new__(cls)
    state = obj.__dict__.copy()
    state.update(changes)
    object.__setattr__(new, "__dict__", state)  # past the frozen __setattr__
    return new


# True only to mypyc (proofs/compiled.py passes --always-true COMPILING): it compiles the
# branch that runs, while mypy checks every call against dataclasses.replace
COMPILING = False

if TYPE_CHECKING and not COMPILING:
    from dataclasses import replace as replace
else:
    replace = _copy_with
