"""Reach: which branches of the reference (kvcache/ and scheduler/) a campaign's
reference rows take, measured with coverage.py (a dev dependency; optional at run time)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

R = TypeVar("R")
PACKAGE = Path(__file__).resolve().parent.parent
MEASURED = [str(PACKAGE / "kvcache"), str(PACKAGE / "scheduler")]
OMITTED = [str(PACKAGE / "kvcache" / "pool" / "*")]  # the byte pools: the backend tests reach them


@dataclass
class Reach:
    """Branch coverage gathered over the calls measured so far. Only branches count:
    the modules were imported before measuring began, so their top-level lines would
    count as missed, while every branch sits in a function body."""

    taken: int
    branches: int
    missing: list[str]  # "file:line -> target" for each branch never taken

    @property
    def percent(self) -> float:
        return 100.0 * self.taken / self.branches if self.branches else 100.0

    def summary(self) -> str:
        return (f"branch coverage of kvcache/ and scheduler/ by the reference rows: {self.percent:.1f}% "
                f"({self.taken} of {self.branches} branches)")


class Tracker:
    """Measures the reference rows only: `measured(run)` runs `run` under coverage."""

    def __init__(self) -> None:
        import coverage  # raises ImportError with the package name when it is missing

        self.cov = coverage.Coverage(branch=True, source=MEASURED, omit=OMITTED, data_file=None)

    def measured(self, run: Callable[[], R]) -> R:
        with self._on():
            return run()

    @contextmanager
    def _on(self) -> Iterator[None]:
        self.cov.start()
        try:
            yield
        finally:
            self.cov.stop()

    def arcs(self) -> dict[str, set[tuple[int, int]]]:
        """The branches measured here, per file (to merge those of worker processes)."""
        data = self.cov.get_data()
        return {f: set(data.arcs(f) or ()) for f in data.measured_files()}

    def merge(self, arcs: dict[str, set[tuple[int, int]]]) -> None:
        self.cov.get_data().add_arcs({f: list(a) for f, a in arcs.items()})

    def reach(self) -> Reach:
        taken = total = 0
        missing: list[str] = []
        self.cov.report(file=io.StringIO())  # makes the analysis of every measured file available
        for path in sorted(self.cov.get_data().measured_files()):
            analysis = self.cov._analyze(path)  # coverage.py 7: branch numbers are only on the analysis
            total += analysis.numbers.n_branches
            taken += analysis.numbers.n_branches - analysis.numbers.n_missing_branches
            name = str(Path(path).relative_to(PACKAGE))
            for line, targets in sorted(analysis.missing_branch_arcs().items()):
                missing += [f"{name}:{line} -> {'exit' if t < 0 else t}" for t in targets]
        return Reach(taken, total, missing)
