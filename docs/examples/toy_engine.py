"""A toy engine with a prefix cache, chunked prefill and one planted bug, and its
kvoracle adapter: the worked example of docs/engines.md. Check it with

    kvoracle check --adapter docs/examples/toy_engine.py:ToyAdapter --show

The bug: `evict` returns a cached block to the free list but leaves it in the hash map,
so a later request can match a block that has been handed to someone else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted


class ToyEngine:
    """Blocks 0..n-1; full blocks are cached by the hash of their whole prefix."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_list = list(range(blocks))
        self.cached: dict[int, int] = {}  # prefix hash -> block
        self.refs: dict[int, int] = {}  # cached block -> requests using it
        self.tables: dict[str, list[int]] = {}
        self.prompts: dict[str, list[int]] = {}  # each running request's tokens so far

    def _prefixes(self, tokens: Sequence[int]) -> list[int]:
        full = len(tokens) // self.block_size
        return [hash(tuple(tokens[: (i + 1) * self.block_size])) for i in range(full)]

    def admit(self, rid: str, tokens: Sequence[int]) -> bool:
        hits = []
        for h in self._prefixes(tokens):
            if h not in self.cached:
                break
            hits.append(self.cached[h])
        need = -(-len(tokens) // self.block_size) - len(hits)
        if need > len(self.free_list):
            return False
        fresh = [self.free_list.pop() for _ in range(need)]
        for b in hits:
            self.refs[b] = self.refs.get(b, 0) + 1
        table = hits + fresh
        for h, b in list(zip(self._prefixes(tokens), table))[len(hits):]:
            self.cached[h] = b
            self.refs[b] = 1
        self.tables[rid] = table
        self.prompts[rid] = list(tokens)
        return True

    def prefill(self, rid: str, tokens: Sequence[int]) -> bool:
        """The next chunk of a running request's prompt: blocks for its tokens, and each
        full block it completes cached, unless another request cached that prefix first
        (then the block stays the request's own)."""
        table, seen = self.tables[rid], self.prompts[rid]
        need = -(-(len(seen) + len(tokens)) // self.block_size) - len(table)
        if need > len(self.free_list):
            return False
        table += [self.free_list.pop() for _ in range(need)]
        done = len(self._prefixes(seen))
        seen += tokens
        for h, b in list(zip(self._prefixes(seen), table))[done:]:
            if h not in self.cached:
                self.cached[h] = b
                self.refs[b] = 1
        return True

    def finish(self, rid: str) -> None:
        del self.prompts[rid]
        for b in self.tables.pop(rid):
            if b in self.refs:
                self.refs[b] -= 1
            else:
                self.free_list.append(b)

    def evict(self, n: int) -> int:
        idle = [b for b, r in self.refs.items() if r == 0][:n]
        for b in idle:
            del self.refs[b]
            self.free_list.append(b)  # BUG: the hash map still points at b
        return len(idle)


class ToyAdapter(Scripted):
    name = "toy"
    block_size = 2
    operations = frozenset({Op.ADMIT, Op.PREFILL, Op.FINISH, Op.EVICT})
    bad_inputs = frozenset({BadInput.DOUBLE_FINISH})
    preamble = (
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "from toy_engine import ToyEngine\n"
        "engine = ToyEngine(blocks=6, block_size=2)\n"
    )
    assertions = (
        "held = [b for t in engine.tables.values() for b in t]\n"
        "assert not set(held) & set(engine.free_list), 'INV-NO-UAF: a held block is on the free list'\n"
        "if not held:  # nothing runs: every block is free or cached and idle\n"
        "    assert len(set(engine.free_list) | set(engine.refs)) == 6, 'LIVE-DRAIN: a block is lost'\n"
    )

    def bind(self) -> None:
        self.engine: Any = self.namespace["engine"]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        before = {h for h in self.engine.cached}
        if not self.run(f"_ = engine.admit({rid!r}, {list(tokens)})"):
            raise NoRoom(rid)
        return sum(h in before for h in self.engine._prefixes(tokens))

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        if not self.run(f"_ = engine.prefill({rid!r}, {list(tokens)})"):
            raise NoRoom(rid)

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        raise NotImplementedError  # Op.GROW is not declared

    def finish(self, rid: str) -> None:
        self.run(f"engine.finish({rid!r})")

    def evict(self, blocks: int) -> int:
        return int(self.run(f"_ = engine.evict({blocks})"))

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        if kind is BadInput.DOUBLE_FINISH and rid is not None and rid not in self.engine.tables:
            self.run_bad(f"engine.finish({rid!r})")
            return True
        return False

    def observe(self) -> Observation:
        e = self.engine
        return Observation(
            ids=range(6),
            free=tuple(e.free_list),
            evictable=tuple(b for b, r in e.refs.items() if r == 0),
            tables={rid: tuple(t) for rid, t in e.tables.items()},
            cached=frozenset(e.refs),
            refcounts=dict(e.refs),
        )
