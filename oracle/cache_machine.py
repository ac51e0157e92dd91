"""The cache-level stateful machine: every operation of a tiered cache, every transfer
outcome in any order, and bad input, through the tiered-cache adapter Protocol
(oracle.tiered), with refinement against spec/.

After each step it checks every invariant the adapter's observations allow, the
engine's own structural checks, and that abstraction(after) equals the spec action
applied to abstraction(before) with the choices the engine reported. Teardown checks
LIVE-DRAIN. It drives the reference (ReferenceCache); subclass and set `make_adapter`
to check a mutant or another engine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvoracle.oracle.engine import CACHE_LEVEL, BadInput, check, check_tier, not_free, with_observed
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.tiered import Blocks, TieredAdapter
from kvoracle.oracle.violations import PropertyViolated, refused
from kvoracle.spec import actions
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import CacheState, gpu_evictable
from kvoracle.spec.types import BlockHash, Error, Ok, Outcome, Partial, RequestId, Timeout

R = TypeVar("R")
# Prompts that share prefixes, so that matches, collisions and partial blocks all happen
# (with blocks of 2 tokens; `prompt` widens them for larger blocks).
PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 1, 2, 2, 1),
    (1, 1, 2, 2, 2, 2),
    (1, 1, 2, 1),
    (2, 2, 1),
)


def prompt(p: int, block_size: int) -> list[int]:
    """PROMPTS[p] with each token widened to half a block, so block structure is kept."""
    return [t for t in PROMPTS[p] for _ in range(max(1, block_size // 2))]

# Ok first: it is what shrinking falls back to, and most transfers succeed.
outcomes: st.SearchStrategy[Outcome] = st.sampled_from(
    [Ok(), Ok(), Error(), Timeout(), Partial(0), Partial(1), Partial(2)]
)

settle: st.SearchStrategy[Outcome | None] = st.one_of(st.none(), outcomes)


@dataclass
class Live:
    tokens: list[int]
    blocks: int  # length of its block table once placed


@dataclass
class Tally:
    steps: int = 0
    bad_inputs: int = 0
    faults: int = 0
    per_rule: dict[str, int] = field(default_factory=dict)


class CacheMachine(RuleBasedStateMachine):
    make_adapter: Callable[[], TieredAdapter] = ReferenceCache
    deep_every = 1  # run the full invariant check every k steps (1: every step)
    tally = Tally()  # shared across examples, read by campaigns

    def __init__(self) -> None:
        super().__init__()
        self.engine = type(self).make_adapter()
        self.live: dict[RequestId, Live] = {}
        self.gone: list[RequestId] = []
        self.next_request = 0

    # --- the checking core -----------------------------------------------------------

    def _step(self, name: str, impl: Callable[[], R], spec: Callable[[CacheState, R], CacheState]) -> R:
        """Run one engine call; check invariants and refinement."""
        before = self.engine.abstract()
        result = impl()
        self._count(name)
        self._check(name)
        got = self.engine.abstract()
        if before is not None and got is not None:
            want = spec(before, result)
            if got != want:
                raise PropertyViolated(name, [Violation("REFINEMENT", _diff(want, got))])
        return result

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1

    def _check(self, name: str) -> None:
        if type(self).tally.steps % self.deep_every:
            return
        e, size = self.engine, self.engine.block_size
        live = {f"r{r}": held.blocks * size for r, held in self.live.items()}
        found = with_observed(e.invariants(), check(e.observe(), live, size) + check_tier(e.observe_cpu()))
        if found:
            raise PropertyViolated(name, found)

    def _pick(self, i: int) -> RequestId | None:
        if not self.live:
            return None
        return sorted(self.live)[i % len(self.live)]

    def _full(self, r: RequestId) -> Blocks:
        """The request's full blocks, as far as its table reaches."""
        held, size = self.live[r], self.engine.block_size
        hashes = block_hashes(held.tokens, size)[: held.blocks]
        return Blocks(tuple(held.tokens[: len(hashes) * size]), hashes)

    # --- rules -------------------------------------------------------------------------

    def _make_room(self, need: int) -> None:
        short = need - self.engine.free_gpu()
        if short > 0:
            self._evict(short)

    @rule(p=st.integers(0, len(PROMPTS) - 1), then=settle, prefill=st.booleans())
    def admit(self, p: int, then: Outcome | None, prefill: bool) -> None:
        """Match the prompt's prefix and allocate the rest (evicting first if needed).
        With `then`, the swap-in or prefetch the match started completes at once; with
        `prefill`, the full blocks are committed when nothing is in flight."""
        if len(self.live) >= 4:
            return
        e = self.engine
        r = RequestId(self.next_request)
        self.next_request += 1
        tokens = prompt(p, e.block_size)
        asked = Blocks(tuple(tokens), block_hashes(tokens, e.block_size))
        blocks = -(-len(tokens) // e.block_size)
        self._make_room(blocks - e.gpu_hits(asked))
        need = blocks - e.gpu_hits(asked)
        if need > e.free_gpu():
            return  # no room: admission waits
        self.live[r] = Live(tokens, 0)  # before the call: the check after it expects the request
        self._step(
            "match",
            lambda: e.match(r, asked, limit=need),
            lambda s, got: actions.match(s, r, asked.hashes, got.swap_dests, got.prefetch_dests),
        )
        rest = blocks - len(e.table(r))
        self._step("allocate", lambda: e.allocate(r, rest), lambda s, got: actions.allocate(s, r, got))
        self.live[r].blocks = blocks
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
        if not self.engine.free_gpu():
            return
        self._step("grow", lambda: self.engine.allocate(r, 1), lambda s, got: actions.allocate(s, r, got))
        held, size = self.live[r], self.engine.block_size
        held.tokens = held.tokens[: held.blocks * size] + [token] * (size * (held.blocks + 1) - len(held.tokens))
        held.blocks += 1

    @rule(i=st.integers(0, 7))
    def commit(self, i: int) -> None:
        r = self._pick(i)
        if r is None or not self.engine.ready(r):
            return
        full = self._full(r)
        self._step("commit", lambda: self.engine.commit(r, full), lambda s, _: actions.commit(s, r, full.hashes))

    @rule(i=st.integers(0, 7), write=st.booleans())
    def release(self, i: int, write: bool) -> None:
        """finish / abort / preempt at cache level: optionally write, then release."""
        r = self._pick(i)
        if r is None:
            return
        written = self._full(r) if write else Blocks((), ())
        del self.live[r]  # before the call: the check after it expects the request gone
        self.gone.append(r)
        self._step(
            "release",
            lambda: self.engine.release(r, written),
            lambda s, writes: actions.release(s, r, writes),
        )

    @rule(need=st.integers(1, 4), tier=st.sampled_from(["gpu", "gpu", "cpu"]), then=settle)
    def evict(self, need: int, tier: str, then: Outcome | None) -> None:
        """Evict; with `then`, the swap-out it starts completes at once with that outcome."""
        if tier == "cpu":
            self._step("evict_cpu", lambda: self.engine.evict_cpu(need), actions.evict)
            return
        self._evict(need)
        self._settle(then)

    def _settle(self, outcome: Outcome | None) -> None:
        """Complete the newest transfer now (what a synchronous engine would do)."""
        pending = self.engine.in_flight()
        if outcome is not None and pending:
            self.complete(len(pending) - 1, outcome)

    def _evict(self, need: int) -> None:
        before = self.engine.abstract()
        try:
            steps = self._step("evict_gpu", lambda: self.engine.evict_gpu(need), actions.evict)
        except PropertyViolated:
            raise
        except Exception as e:  # a wedged eviction raises forever (bug class 12)
            raise PropertyViolated("evict_gpu", [Violation("LIVE-EVICT", f"eviction raised {e!r}")]) from e
        if before is not None and not steps and any(gpu_evictable(before, h) for h in before.nodes):
            raise PropertyViolated("evict_gpu", [Violation("LIVE-EVICT", "evictable nodes exist but none evicted")])

    @rule(i=st.integers(0, 7), outcome=outcomes)
    def complete(self, i: int, outcome: Outcome) -> None:
        """Any in-flight transfer, in any order, with any outcome."""
        pending = self.engine.in_flight()
        if not pending:
            return
        job = pending[i % len(pending)]
        if isinstance(outcome, Partial) and outcome.done > job.items:
            outcome = Partial(job.items)
        if not isinstance(outcome, Ok):
            type(self).tally.faults += 1
        t = job.transfer
        self._step("complete", lambda: self.engine.complete(t, outcome), lambda s, _: actions.complete(s, t, outcome))

    @rule()
    def reset(self) -> None:
        if self.live or not self.engine.cached():
            return
        self._step("reset", self.engine.reset, lambda s, _: actions.reset(s))

    @rule(kind=st.sampled_from(CACHE_LEVEL))
    def bad_input(self, kind: BadInput) -> None:
        """A bad call must raise the adapter's declared exception and change nothing."""
        error = self.engine.refusals.get(kind)
        if error is None:
            return
        twice = kind is BadInput.DOUBLE_FINISH  # about a request that ended
        r = (self.gone[-1] if self.gone else None) if twice else self._pick(0)
        refused(kind.value, error, lambda: self.engine.bad_call(kind, r), self.engine.snapshot,
                lambda: self._made_bad_call(kind.value))

    def _made_bad_call(self, name: str) -> None:
        type(self).tally.bad_inputs += 1
        self._count(name)
        self._check(name)

    # --- LIVE-DRAIN ------------------------------------------------------------------------

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a step already failed: keep its report
        drain(self, bound=4 * (self.engine.gpu_blocks + self.engine.cpu_blocks) + 8)


def drain(m: CacheMachine, bound: int) -> int:
    """LIVE-DRAIN: release everything, complete every transfer, evict everything;
    every block must be free within `bound` rounds. Returns the rounds used."""
    e = m.engine
    for r in sorted(m.live):
        m.release(0, write=False)
    for rounds in range(bound):
        for job in e.in_flight():
            t = job.transfer
            m._step("drain:complete", lambda: e.complete(t, Ok()), lambda s, _: actions.complete(s, t, Ok()))
        m._step("drain:evict_cpu", lambda: e.evict_cpu(e.cpu_blocks), actions.evict)
        m._evict(e.gpu_blocks)
        if not e.in_flight() and _held(e) == (0, 0):
            return rounds
    gpu, cpu = _held(e)
    raise PropertyViolated(
        "drain",
        [Violation("LIVE-DRAIN", f"after {bound} rounds {gpu} GPU and {cpu} CPU blocks are still not free")],
    )


def _held(e: TieredAdapter) -> tuple[int, int]:
    """GPU and CPU blocks not free."""
    return not_free(e.observe()), not_free(e.observe_cpu())


def _diff(want: CacheState, got: CacheState) -> str:
    parts = []
    for f in want.__dataclass_fields__:
        a, b = getattr(want, f), getattr(got, f)
        if a != b:
            parts.append(f"{f}: spec {a!r} / implementation {b!r}")
    return "abstraction differs from the spec action: " + "; ".join(parts)
