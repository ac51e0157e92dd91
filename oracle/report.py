"""Plain-text tables for the command line: a header, a rule, left-aligned columns."""

from __future__ import annotations

from collections.abc import Sequence


def columns(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
                     for cells in (head, tuple("-" * w for w in widths), *body))
