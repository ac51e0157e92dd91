"""`replace`: a copy of one of spec's frozen dataclasses with some fields changed.

It means `dataclasses.replace`, and the type checker sees that function (so a misspelt
or mistyped field is an error there; at run time nothing checks the names, which is
why mypy --strict runs over every package). At run time it copies the fields
without calling `__init__` again: the actions build several states per step, and
`dataclasses.replace` (field lookup, keyword call, a frozen `__setattr__` per field)
was the model checker's largest cost. Spec's dataclasses have no `__post_init__`, no
`init=False` fields and no `__slots__`, which is what makes the copy equivalent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

T = TypeVar("T")


def _copy_with(obj: T, /, **changes: object) -> T:
    new: T = object.__new__(type(obj))
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields.update(changes)
    return new


if TYPE_CHECKING:
    from dataclasses import replace as replace
else:
    replace = _copy_with
