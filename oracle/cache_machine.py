"""The cache-level stateful machine: every operation of the reference cache, every
transfer outcome in any order, and bad input, with refinement against spec/.

After each step it checks every invariant and that abstraction(after) equals the
spec action applied to abstraction(before) with the choices the cache reported.
Teardown checks LIVE-DRAIN. Subclass and set `cache_class` to check a mutant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvcache.abstraction import abstract, check_invariants, observe
from kvcache.errors import (
    BlockOutOfRange,
    DoubleFree,
    DuplicateRequest,
    HashMismatch,
    InvalidOutcome,
    KVCacheError,
    NotQuiescent,
    OutOfBlocks,
    UnknownRequest,
    UnknownTransfer,
)
from kvcache.manager import CacheManager
from oracle.violations import PropertyViolated
from spec import actions
from spec.hashing import block_hashes
from spec.invariants import Violation
from spec.state import CacheState, gpu_evictable
from spec.types import BlockHash, CpuBlock, Error, GpuBlock, Ok, Outcome, Partial, RequestId, Timeout, TransferId

R = TypeVar("R")
BLOCK = 2
# Prompts that share prefixes, so that matches, collisions and partial blocks all happen.
PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 1, 2, 2, 1),
    (1, 1, 2, 2, 2, 2),
    (1, 1, 2, 1),
    (2, 2, 1),
)

# Ok first: it is what shrinking falls back to, and most transfers succeed.
outcomes: st.SearchStrategy[Outcome] = st.sampled_from(
    [Ok(), Ok(), Error(), Timeout(), Partial(0), Partial(1), Partial(2)]
)

settle: st.SearchStrategy[Outcome | None] = st.one_of(st.none(), outcomes)


@dataclass
class Live:
    tokens: list[int]
    blocks: int  # length of its block table


@dataclass
class Tally:
    steps: int = 0
    bad_inputs: int = 0
    faults: int = 0
    per_rule: dict[str, int] = field(default_factory=dict)


class CacheMachine(RuleBasedStateMachine):
    cache_class: type[CacheManager] = CacheManager
    gpu_blocks = 6
    cpu_blocks = 3
    deep_every = 1  # run the full invariant check every k steps (1: every step)
    tally = Tally()  # shared across examples, read by campaigns

    def __init__(self) -> None:
        super().__init__()
        self.cache = self.cache_class(self.gpu_blocks, self.cpu_blocks)
        self.live: dict[RequestId, Live] = {}
        self.gone: list[RequestId] = []
        self.next_request = 0

    # --- the checking core -----------------------------------------------------------

    def _step(self, name: str, impl: Callable[[], R], spec: Callable[[CacheState, R], CacheState]) -> R:
        """Run one implementation call; check invariants and refinement."""
        before = abstract(self.cache)
        result = impl()
        self._count(name)
        self._check(name)
        want = spec(before, result)
        got = abstract(self.cache)
        if got != want:
            raise PropertyViolated(name, [Violation("REFINEMENT", _diff(want, got))])
        return result

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1

    def _check(self, name: str) -> None:
        if type(self).tally.steps % self.deep_every == 0:
            found = check_invariants(self.cache)
            if found:
                raise PropertyViolated(name, found)

    def _rejects(self, name: str, error: type[KVCacheError], call: Callable[[], object]) -> None:
        """Bad input: the call must raise `error` and leave every structure as it was."""
        before, seen = abstract(self.cache), observe(self.cache)
        type(self).tally.bad_inputs += 1
        raised: BaseException | None = None
        try:
            call()
        except KVCacheError as e:
            raised = e
        self._count(name)
        self._check(name)
        if not isinstance(raised, error):
            what = "accepted" if raised is None else f"raised {type(raised).__name__}"
            raise PropertyViolated(name, [Violation("BAD-INPUT", f"expected {error.__name__}, {what}")])
        if abstract(self.cache) != before or observe(self.cache) != seen:
            raise PropertyViolated(name, [Violation("BAD-INPUT", f"{error.__name__} raised but the state changed")])

    def _pick(self, i: int) -> RequestId | None:
        if not self.live:
            return None
        return sorted(self.live)[i % len(self.live)]

    def _hashes(self, r: RequestId) -> tuple[BlockHash, ...]:
        held = self.live[r]
        return block_hashes(held.tokens, BLOCK)[: held.blocks]

    # --- rules -------------------------------------------------------------------------

    def _make_room(self, need: int) -> None:
        short = need - self.cache.gpu.num_free
        if short > 0:
            self._evict(short)

    @rule(p=st.integers(0, len(PROMPTS) - 1), then=settle, prefill=st.booleans())
    def admit(self, p: int, then: Outcome | None, prefill: bool) -> None:
        """Match the prompt's prefix and allocate the rest (evicting first if needed).
        With `then`, the swap-in or prefetch the match started completes at once; with
        `prefill`, the full blocks are committed when nothing is in flight."""
        if len(self.live) >= 4:
            return
        r = RequestId(self.next_request)
        self.next_request += 1
        tokens = list(PROMPTS[p])
        hashes = block_hashes(tokens, BLOCK)
        blocks = -(-len(tokens) // BLOCK)
        self._make_room(blocks - self.cache.gpu_hits(hashes))
        need = blocks - self.cache.gpu_hits(hashes)
        if need > self.cache.gpu.num_free:
            return  # no room: admission waits
        self._step(
            "match",
            lambda: self.cache.match(r, hashes, limit=need),
            lambda s, rep: actions.match(s, r, hashes, rep.swap_dests, rep.prefetch_dests),
        )
        self.live[r] = Live(tokens, blocks)
        rest = blocks - len(self.cache.table(r))
        self._step(
            "allocate",
            lambda: self.cache.allocate(r, rest),
            lambda s, got: actions.allocate(s, r, got),
        )
        self._settle(then)
        if prefill:
            self.commit(len([x for x in self.live if x < r]))

    @rule(i=st.integers(0, 7), token=st.integers(1, 2))
    def grow(self, i: int, token: int) -> None:
        """Decode fills the last block: one more block."""
        r = self._pick(i)
        if r is None:
            return
        self._make_room(1)
        if not self.cache.gpu.num_free:
            return
        self._step("grow", lambda: self.cache.allocate(r, 1), lambda s, got: actions.allocate(s, r, got))
        held = self.live[r]
        held.tokens = held.tokens[: held.blocks * BLOCK] + [token] * (BLOCK * (held.blocks + 1) - len(held.tokens))
        held.blocks += 1

    @rule(i=st.integers(0, 7))
    def commit(self, i: int) -> None:
        r = self._pick(i)
        if r is None or not self.cache.ready(r):
            return
        hashes = self._hashes(r)
        self._step("commit", lambda: self.cache.commit(r, hashes), lambda s, _: actions.commit(s, r, hashes))

    @rule(i=st.integers(0, 7), write=st.booleans())
    def release(self, i: int, write: bool) -> None:
        """finish / abort / preempt at cache level: optionally write, then release."""
        r = self._pick(i)
        if r is None:
            return
        hashes = self._hashes(r) if write else ()
        self._step(
            "release",
            lambda: self.cache.release(r, hashes),
            lambda s, rep: actions.release(s, r, rep.writes),
        )
        del self.live[r]
        self.gone.append(r)

    @rule(need=st.integers(1, 4), tier=st.sampled_from(["gpu", "gpu", "cpu"]), then=settle)
    def evict(self, need: int, tier: str, then: Outcome | None) -> None:
        """Evict; with `then`, the swap-out it starts completes at once with that outcome."""
        if tier == "cpu":
            self._step("evict_cpu", lambda: self.cache.evict_cpu(need), lambda s, rep: actions.evict(s, rep.steps))
            return
        self._evict(need)
        self._settle(then)

    def _settle(self, outcome: Outcome | None) -> None:
        """Complete the newest transfer now (what a synchronous engine would do)."""
        pending = self.cache.in_flight()
        if outcome is not None and pending:
            self.complete(len(pending) - 1, outcome)

    def _evict(self, need: int) -> None:
        before = abstract(self.cache)
        try:
            rep = self._step("evict_gpu", lambda: self.cache.evict_gpu(need), lambda s, rep: actions.evict(s, rep.steps))
        except PropertyViolated:
            raise
        except Exception as e:  # a wedged eviction raises forever (bug class 12)
            raise PropertyViolated("evict_gpu", [Violation("LIVE-EVICT", f"eviction raised {e!r}")]) from e
        if not rep.steps and any(gpu_evictable(before, h) for h in before.nodes):
            raise PropertyViolated("evict_gpu", [Violation("LIVE-EVICT", "evictable nodes exist but none evicted")])

    @rule(i=st.integers(0, 7), outcome=outcomes)
    def complete(self, i: int, outcome: Outcome) -> None:
        """Any in-flight transfer, in any order, with any outcome."""
        pending = self.cache.in_flight()
        if not pending:
            return
        t = pending[i % len(pending)]
        size = len(self.cache.jobs[t].items)
        if isinstance(outcome, Partial) and outcome.done > size:
            outcome = Partial(size)
        if not isinstance(outcome, Ok):
            type(self).tally.faults += 1
        self._step("complete", lambda: self.cache.complete(t, outcome), lambda s, _: actions.complete(s, t, outcome))

    @rule()
    def reset(self) -> None:
        if self.live or not self.cache.tree.size:
            return
        self._step("reset", self.cache.reset, lambda s, _: actions.reset(s))

    @rule(kind=st.sampled_from(["double_free", "out_of_range", "wrong_tier", "double_release", "unknown_request",
                                "unknown_transfer", "bad_partial", "duplicate_match", "hash_mismatch", "too_many",
                                "busy_reset"]))
    def bad_input(self, kind: str) -> None:
        c = self.cache
        if kind == "double_free" and c.gpu.num_free:
            g = c.gpu.free_blocks()[-1]
            self._rejects(kind, DoubleFree, lambda: c.gpu.free([g]))
        elif kind == "out_of_range":
            self._rejects(kind, BlockOutOfRange, lambda: c.gpu.free([GpuBlock(c.gpu.size)]))
        elif kind == "wrong_tier":
            self._rejects(kind, BlockOutOfRange, lambda: c.cpu.free([CpuBlock(c.gpu.size - 1)]))
        elif kind == "double_release" and self.gone:
            r = self.gone[-1]
            self._rejects(kind, UnknownRequest, lambda: c.release(r))
        elif kind == "unknown_request":
            self._rejects(kind, UnknownRequest, lambda: c.commit(RequestId(10**6), ()))
        elif kind == "unknown_transfer":
            self._rejects(kind, UnknownTransfer, lambda: c.complete(TransferId(10**6), Ok()))
        elif kind == "bad_partial" and c.jobs:
            t = c.in_flight()[0]
            self._rejects(kind, InvalidOutcome, lambda: c.complete(t, Partial(len(c.jobs[t].items) + 1)))
        elif kind == "duplicate_match" and self.live:
            r = sorted(self.live)[0]
            self._rejects(kind, DuplicateRequest, lambda: c.match(r, ()))
        elif kind == "hash_mismatch" and self.live:
            r = sorted(self.live)[0]
            bogus = (BlockHash(1),) * (len(c.table(r)) + 1)
            self._rejects(kind, HashMismatch, lambda: c.commit(r, bogus))
        elif kind == "busy_reset" and self.live:
            self._rejects(kind, NotQuiescent, c.reset)
        elif kind == "too_many" and self.live:
            r = sorted(self.live)[0]
            self._rejects(kind, OutOfBlocks, lambda: c.allocate(r, c.gpu.num_free + 1))

    # --- LIVE-DRAIN ------------------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a step already failed: keep its report
        drain(self, bound=4 * (self.gpu_blocks + self.cpu_blocks) + 8)


def drain(m: CacheMachine, bound: int) -> int:
    """LIVE-DRAIN: release everything, complete every transfer, evict everything;
    every block must be free within `bound` rounds. Returns the rounds used."""
    for r in sorted(m.live):
        m.release(0, write=False)
    for rounds in range(bound):
        for t in m.cache.in_flight():
            m._step("drain:complete", lambda: m.cache.complete(t, Ok()), lambda s, _: actions.complete(s, t, Ok()))
        m._step("drain:evict_cpu", lambda: m.cache.evict_cpu(m.cpu_blocks), lambda s, rep: actions.evict(s, rep.steps))
        m._evict(m.gpu_blocks)
        s = abstract(m.cache)
        if len(s.gpu_free) == s.gpu_size and len(s.cpu_free) == s.cpu_size and not s.transfers:
            return rounds
    s = abstract(m.cache)
    raise PropertyViolated(
        "drain",
        [Violation("LIVE-DRAIN", f"after {bound} rounds {s.gpu_size - len(s.gpu_free)} GPU and "
                   f"{s.cpu_size - len(s.cpu_free)} CPU blocks are still not free")],
    )


def _diff(want: CacheState, got: CacheState) -> str:
    parts = []
    for f in want.__dataclass_fields__:
        a, b = getattr(want, f), getattr(got, f)
        if a != b:
            parts.append(f"{f}: spec {a!r} / implementation {b!r}")
    return "abstraction differs from the spec action: " + "; ".join(parts)


