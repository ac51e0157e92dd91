"""The cache-level stateful machine: every operation of a tiered cache, every transfer
outcome in any order, prefill in chunks of the machine's choosing, and bad input,
through the tiered-cache adapter Protocol (oracle.tiered).

The machine keeps its own record of the specification's state: after each engine call
it applies the spec action the call names, with the choices the engine reported
(spec.actions). After each call it evaluates spec's properties on what it can see:
the engine's abstraction (when the adapter gives one), the engine's observations,
and the engine's own structural checks; then refinement: the abstraction must equal
the record. A step whose choices the specification does not allow is REFINEMENT too.
Teardown checks LIVE-DRAIN. An exception from a valid call is a finding (VALID-INPUT,
or the exit or eviction property it cut short), never a crash of the campaign.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvoracle.oracle import threads, watchdog
from kvoracle.oracle.audit import Audit, walk
from kvoracle.oracle.engine import CACHE_LEVEL, BadInput, call_starts, view_of
from kvoracle.oracle.engines.reference_cache import ReferenceCache
from kvoracle.oracle.interrupts import stops
from kvoracle.oracle.tiered import Blocks, Call, TieredAdapter, action_of
from kvoracle.oracle.violations import PropertyViolated, abstraction_gone, raised_on_valid_call, refused
from kvoracle.spec import liveness
from kvoracle.spec.actions import CacheEvent, PreconditionError, apply_cache
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation
from kvoracle.spec.refinement import not_a_step, refines, reports_ready
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import Error, Ok, Outcome, Partial, RequestId, Timeout
from kvoracle.spec.view import View, of_cache, request_name

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

# What a transfer can end with; an adapter's `transfer_outcomes` may name fewer.
OUTCOME_KINDS = frozenset({"ok", "error", "timeout", "partial"})

settle: st.SearchStrategy[Outcome | None] = st.one_of(st.none(), outcomes)


@dataclass
class Live:
    tokens: list[int]
    blocks: int  # length of its block table once fully placed
    placed: int = 0  # blocks placed so far (matched or allocated): prefill chunks add more


@dataclass
class Tally:
    steps: int = 0
    bad_inputs: int = 0
    faults: int = 0
    per_rule: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)  # transfers ended, by outcome


class CacheMachine(RuleBasedStateMachine):
    make_adapter: Callable[[], TieredAdapter] = ReferenceCache
    tally = Tally()  # shared across examples, read by campaigns

    def __init__(self) -> None:
        super().__init__()
        watchdog.kick()  # building the engine is watched too
        with threads.building():  # the engine's threads watched from here to the teardown
            self.engine = type(self).make_adapter()
            self.model: CacheState | None = self.engine.abstract()  # the checker's record (None: not refinable)
        self.live: dict[RequestId, Live] = {}
        self.gone: list[RequestId] = []
        self.comeback: list[int] | None = None  # the tokens of the request released last
        self.next_request = 0
        self.mark = 0  # engine calls made before the current one (for reproductions)
        self.asked = 0  # blocks the latest GPU eviction asked for
        self.audit = Audit()
        self.refining: tuple[CacheState, Call] | None = None  # the record before the call being refined, and the call

    # --- the checking core -----------------------------------------------------------

    def _step(self, name: str, call: Call, exiting: RequestId | None = None) -> object:
        """Run one engine call; check LIVE-EXIT on the request it ends (if any), every
        safety property (when the audit is due: oracle.audit), then refinement."""
        self.mark = call_starts(self.engine)
        before = self.view() if exiting is not None else None
        try:
            result = call.run(self.engine)
        except PropertyViolated:
            raise
        except BaseException as e:
            if stops(e):
                raise
            raise PropertyViolated(name, self._exit(before, exiting) + [self._escaped(name, e)]) from e
        self._count(name)
        found = self._exit(before, exiting) + threads.died(name)
        if found:
            raise PropertyViolated(name, found)
        got = self._check(name) if self.audit.due() else None
        if self.model is not None:
            self.refining = (self.model, call)  # what a reproduction of a REFINEMENT here makes again
            self._refine(name, action_of(call, result), got)
            self.refining = None
        return result

    def _exit(self, before: View | None, r: RequestId | None) -> list[Violation]:
        if before is None or r is None:
            return []
        return liveness.live_exit(before, self.view(), request_name(r))

    @staticmethod
    def _escaped(name: str, e: BaseException) -> Violation:
        if name.endswith("evict_gpu"):
            return liveness.live_evict(None, 0, 0, None, raised=e)[0]
        return raised_on_valid_call(name, e)

    def _refine(self, name: str, event: CacheEvent, got: CacheState | None) -> None:
        """`got`: the engine's abstraction after the call, when the audit already took it."""
        assert self.model is not None
        after = next_record(self.model, name, event)
        if isinstance(after, Violation):
            raise PropertyViolated(name, [after])
        self.model = after
        got = self.engine.abstract() if got is None else got
        found = refines(self.model, got) if got is not None else [abstraction_gone(name, "abstract")]
        if found:
            raise PropertyViolated(name, found)

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1

    def view(self) -> View:
        e, size = self.engine, self.engine.block_size
        live = {request_name(r): held.placed * size for r, held in self.live.items()}
        return view_of(e.observe(), e.observe_cpu(), live, size)

    def _check(self, name: str) -> CacheState | None:
        """The audit; returns the abstraction it judged (None: the engine has none)."""
        got = self.engine.abstract()
        found = walk(None if got is None else of_cache(got), self.engine.invariants(), self.view())
        if found:
            raise PropertyViolated(name, found)
        return got

    def _ready(self, r: RequestId) -> bool:
        """Whether nothing still fills r's table: the engine's answer, which must be spec's
        on the record (REFINEMENT), so that a request the engine leaves waiting for ever
        is a finding and not a bad call the machine declines to make."""
        said = self.engine.ready(r)
        found = reports_ready(self.model, r, said, len(self.engine.in_flight()))
        if found:
            raise PropertyViolated("ready", found)
        return said

    def _pick(self, i: int) -> RequestId | None:
        if not self.live:
            return None
        return sorted(self.live)[i % len(self.live)]

    def _full(self, r: RequestId) -> Blocks:
        """The request's full blocks, as far as its table reaches."""
        held, size = self.live[r], self.engine.block_size
        hashes = block_hashes(held.tokens, size)[: held.placed]
        return Blocks(tuple(held.tokens[: len(hashes) * size]), hashes)

    # --- rules -------------------------------------------------------------------------

    def _make_room(self, need: int) -> None:
        short = need - self.engine.free_gpu()
        if short > 0:
            self._evict(short)

    @precondition(lambda m: len(m.live) < 4)
    @rule(p=st.integers(0, len(PROMPTS) - 1), then=settle, prefill=st.booleans(), chunk=st.integers(0, 3),
          budget=st.integers(0, 3), cold=st.integers(0, 3))
    def admit(self, p: int, then: Outcome | None, prefill: bool, chunk: int, budget: int, cold: int) -> None:
        """Match the prompt's prefix, swapping in and prefetching at most `budget` blocks
        (0: as many as it lacks; 3: a limit above the free list's length, of which the
        engine may take only what is free, and where the prompt does not fit, the match is
        made anyway and released at once, as a scheduler does with a request that must
        wait; an engine without `match_limits` always gets as many as it lacks), and
        allocate the first `chunk` blocks of the rest (0: all of it), evicting first if
        needed. With `then`, the swap-in or prefetch the match started completes at once;
        with `prefill`, the full blocks placed so far are committed when nothing is in
        flight. One admission in two comes after pressure from outside: what the GPU can
        give up leaves it first, so a prompt that comes back finds its prefix on the CPU
        or in storage, and the match swaps in or prefetches; with `cold` 2 the swap-outs
        that starts end ok first, with 3 they stay in flight (the CPU tier fills with
        blocks in transit, and later evictions must drop). 0 and 1, where shrinking goes:
        no pressure. With `cold` 2 the prompt is not p but the tokens of the request
        released last, if any: a conversation that comes back after its prefix left the
        GPU, so the match swaps in (the swap-in paths are otherwise rare: what the
        pressure moves to the CPU tier is seldom the prefix of the next prompt drawn)."""
        if len(self.live) >= 4:
            return
        e = self.engine
        if cold >= 2:
            self._cool(settled=cold == 2)
        r = RequestId(self.next_request)
        self.next_request += 1
        tokens = list(self.comeback) if cold == 2 and self.comeback is not None else prompt(p, e.block_size)
        asked = Blocks(tuple(tokens), block_hashes(tokens, e.block_size))
        blocks = -(-len(tokens) // e.block_size)
        self._make_room(blocks - e.gpu_hits(asked))
        need = blocks - e.gpu_hits(asked)
        limits = getattr(e, "match_limits", True)
        fits = need <= e.free_gpu()
        if not fits and (budget != 3 or not limits):
            return  # no room: admission waits
        self.live[r] = Live(tokens, blocks)  # before the call: the check after it expects the request
        limit = need if not budget or not limits else e.free_gpu() + 1 if budget == 3 else min(budget, need)
        self._step("match", Call("match", (r, asked), limit))
        if not fits:  # as a scheduler whose request does not fit: what the match took goes back, and it waits
            del self.live[r]
            self.gone.append(r)
            self._step("release", Call("release", (r, Blocks((), ()))), exiting=r)
            return
        self.live[r].placed = len(e.table(r))
        rest = blocks - self.live[r].placed
        self._allocate(r, rest if chunk == 0 else min(chunk, rest))
        self._settle(then)
        if prefill and self._ready(r):
            self.commit(len([x for x in self.live if x < r]))

    def _cool(self, settled: bool) -> None:
        """Evict what the GPU can give up; `settled`: the swap-outs that starts end ok."""
        before = {job.transfer for job in self.engine.in_flight()}
        self._evict(self.engine.gpu_blocks)
        if not settled:
            return
        started = [i for i, job in enumerate(self.engine.in_flight()) if job.transfer not in before]
        for i in reversed(started):  # newest first: earlier indexes stay valid
            self.complete(i, Ok())

    def _allocate(self, r: RequestId, n: int) -> None:
        self._step("allocate", Call("allocate", (r, n)))
        self.live[r].placed += n

    @precondition(lambda m: any(held.placed < held.blocks for held in m.live.values()))
    @rule(i=st.integers(0, 7), chunk=st.integers(1, 2), then_commit=st.booleans())
    def prefill(self, i: int, chunk: int, then_commit: bool) -> None:
        """The next chunk of a request's prompt: allocate its blocks (evicting if needed)."""
        r = self._pick(i)
        if r is None or self.live[r].placed >= self.live[r].blocks:
            return
        n = min(chunk, self.live[r].blocks - self.live[r].placed)
        self._make_room(n)
        if self.engine.free_gpu() < n:
            return
        self._allocate(r, n)
        if then_commit and self._ready(r):
            self.commit(i)

    @precondition(lambda m: any(held.placed >= held.blocks for held in m.live.values()))
    @rule(i=st.integers(0, 7), token=st.integers(1, 2))
    def grow(self, i: int, token: int) -> None:
        """Decode fills the last block: one more block."""
        r = self._pick(i)
        if r is None or self.live[r].placed < self.live[r].blocks:
            return
        self._make_room(1)
        if not self.engine.free_gpu():
            return
        self._step("grow", Call("allocate", (r, 1)))
        held, size = self.live[r], self.engine.block_size
        held.tokens = held.tokens[: held.blocks * size] + [token] * (size * (held.blocks + 1) - len(held.tokens))
        held.blocks += 1
        held.placed += 1

    @precondition(lambda m: bool(m.live))
    @rule(i=st.integers(0, 7))
    def commit(self, i: int) -> None:
        """Index the request's full blocks; while a transfer still fills them, the commit
        a hasty scheduler would make is the bad call COMMIT_FILLING."""
        r = self._pick(i)
        if r is None:
            return
        if not self._ready(r):
            self.bad_input(BadInput.COMMIT_FILLING)
            return
        full = self._full(r)
        self._step("commit", Call("commit", (r, full)))

    @precondition(lambda m: bool(m.live))
    @rule(i=st.integers(0, 7), write=st.booleans())
    def release(self, i: int, write: bool) -> None:
        """finish / abort / preempt at cache level: optionally write, then release."""
        r = self._pick(i)
        if r is None:
            return
        written = self._full(r) if write else Blocks((), ())
        self.comeback = self.live[r].tokens
        del self.live[r]  # before the call: the check after it expects the request gone
        self.gone.append(r)
        self._step("release", Call("release", (r, written)), exiting=r)

    @rule(need=st.integers(1, 4), tier=st.sampled_from(["gpu", "gpu", "cpu"]), then=settle)
    def evict(self, need: int, tier: str, then: Outcome | None) -> None:
        """Evict; with `then`, the swap-out it starts completes at once with that outcome."""
        if tier == "cpu":
            self._step("evict_cpu", Call("evict_cpu", (need,)))
            return
        self._evict(need)
        self._settle(then)

    def _settle(self, outcome: Outcome | None) -> None:
        """Complete the newest transfer now (what a synchronous engine would do)."""
        pending = self.engine.in_flight()
        if outcome is not None and pending:
            self.complete(len(pending) - 1, outcome)

    def _evict(self, need: int) -> None:
        self.asked = need
        before = self.model if self.model is not None else self.engine.abstract()
        evictable = len(self.engine.observe().evictable or ())
        steps = self._step("evict_gpu", Call("evict_gpu", (need,)))
        reported = tuple(steps) if isinstance(steps, (tuple, list)) else None  # None: the engine does not say
        found = liveness.live_evict(before, evictable, need, reported)
        if found:
            raise PropertyViolated("evict_gpu", found)

    @precondition(lambda m: bool(m.engine.in_flight()))
    @rule(i=st.integers(0, 7), outcome=outcomes)
    def complete(self, i: int, outcome: Outcome) -> None:
        """Any in-flight transfer, in any order, with any outcome."""
        pending = self.engine.in_flight()
        if not pending:
            return
        job = pending[i % len(pending)]
        if type(outcome).__name__.lower() not in getattr(self.engine, "transfer_outcomes", OUTCOME_KINDS):
            outcome = Ok()  # an outcome the engine's transfers cannot have: it succeeds
        if isinstance(outcome, Partial) and outcome.done > job.items:
            outcome = Partial(job.items)
        t = type(self).tally
        if not isinstance(outcome, Ok):
            t.faults += 1
        key = type(outcome).__name__.lower()
        t.outcomes[key] = t.outcomes.get(key, 0) + 1
        tid = job.transfer
        self._step("complete", Call("complete", (tid, outcome)))

    @precondition(lambda m: not m.live and m.engine.cached())
    @rule()
    def reset(self) -> None:
        self._step("reset", Call("reset"))

    @rule(kind=st.sampled_from(CACHE_LEVEL))
    def bad_input(self, kind: BadInput) -> None:
        """A bad call must raise the adapter's declared exception and change nothing."""
        error = self.engine.refusals.get(kind)
        if error is None:
            return
        twice = kind is BadInput.DOUBLE_FINISH  # about a request that ended
        r = (self.gone[-1] if self.gone else None) if twice else self._pick(0)
        self.mark = call_starts(self.engine)
        refused(kind.value, error, lambda: self.engine.bad_call(kind, r), self.engine.snapshot,
                lambda: self._made_bad_call(kind.value))

    def _made_bad_call(self, name: str) -> None:
        type(self).tally.bad_inputs += 1
        self._count(name)
        threads.check(name)
        if self.audit.due():
            self._check(name)

    # --- LIVE-DRAIN ------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is not None:
                return  # a step already failed: keep its report
            e = self.engine
            self.audit.draining = True
            drain(self, liveness.drain_bound(e.gpu_blocks, e.cpu_blocks, len(self.live)))
            threads.check("the drain")  # a thread that died after the last call
        finally:
            watchdog.pause()
            threads.unwatch()


def next_record(model: CacheState, name: str, event: CacheEvent) -> CacheState | Violation:
    """spec's state after the engine's step `name`, or REFINEMENT where spec refuses it."""
    try:
        return apply_cache(model, event)
    except PreconditionError as err:
        return not_a_step(name, err)


def drain(m: CacheMachine, bound: int) -> int:
    """The drain LIVE-DRAIN judges: release everything, complete every transfer, evict everything, in
    rounds; every block must be free within `bound` rounds. Returns the rounds used."""
    e = m.engine
    for _ in sorted(m.live):
        m.release(0, write=False)
    for rounds in range(bound):
        for job in e.in_flight():
            m._step("drain:complete", Call("complete", (job.transfer, Ok())))
        m._step("drain:evict_cpu", Call("evict_cpu", (e.cpu_blocks,)))
        m._evict(e.gpu_blocks)
        if not liveness.drained(m.view(), len(e.in_flight())):
            return rounds
    left = liveness.drained(m.view(), len(e.in_flight()))  # a bound of no rounds: as it was left
    if left:
        raise PropertyViolated("drain", left)
    return bound
