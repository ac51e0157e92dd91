"""The type of a count option, shared by the command line and the pytest plugin (a
module light enough for a plugin that pytest loads in every session)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(least: int) -> Callable[[str], int]:
    """An option's type: an integer of at least `least` (argparse's usage error otherwise)."""
    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"want an integer of at least {least}, not {text!r}")
        return value

    return count
