"""The engine machine: any engine behind an EngineAdapter, driven with prefix-sharing
prompts under memory pressure, checked after every step with what its observations
allow. With `with_bad_input`, it also makes the raw bad calls the adapter supports.

A bad call the engine refuses must leave its state as it was; one it accepts must
leave every invariant intact. Accepted and harmless (a second finish that does
nothing) is tolerated and counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from kvoracle.oracle import threads, watchdog
from kvoracle.oracle.audit import Audit
from kvoracle.oracle.cache_machine import PROMPTS, prompt
from kvoracle.oracle.engine import REQUEST_LEVEL, REQUIRED_OPS, BadInput, EngineAdapter, NoRoom, Observation, Op, check, call_starts, view_of
from kvoracle.spec import liveness
from kvoracle.oracle.interrupts import stops
from kvoracle.oracle.violations import PropertyViolated, described, kept, raised_on_valid_call
from kvoracle.spec.invariants import Violation

MAX_LIVE = 4
PLACING = ("admit", "prefill", "grow")  # the calls an engine may refuse for want of room
NO_ROOM_HINT = (" (where that is the engine refusing for want of room, the adapter must raise "
                "oracle.engine.NoRoom instead, once the engine's state is as before the call)")


@dataclass
class EngineTally:
    steps: int = 0
    bad_inputs: int = 0
    tolerated: int = 0  # bad calls accepted without any effect
    refused: int = 0  # admissions and growths the engine had no room for
    per_rule: dict[str, int] = field(default_factory=dict)


class EngineMachine(RuleBasedStateMachine):
    make_adapter: Callable[[], EngineAdapter]
    with_bad_input = False
    tally = EngineTally()

    def __init__(self) -> None:
        super().__init__()
        watchdog.kick()  # building the engine is watched too
        with threads.building():  # the engine's threads watched from here to the teardown
            self.adapter = type(self).make_adapter()
            missing = set(REQUIRED_OPS) - self.adapter.operations
            if missing:
                raise TypeError(f"{self.adapter.name}: an adapter must support {sorted(op.value for op in missing)}")
        self.live: dict[str, int] = {}  # request -> tokens held (computed)
        self.prompts: dict[str, list[int]] = {}  # request -> the prompt tokens still to prefill
        self.gone: list[str] = []
        self.next_request = 0
        self.mark = 0  # engine calls made before the current one (for reproductions)
        self.audit = Audit()

    # --- the checking core -----------------------------------------------------------

    def _count(self, name: str) -> None:
        t = type(self).tally
        t.steps += 1
        t.per_rule[name] = t.per_rule.get(name, 0) + 1

    def _check(self, name: str) -> None:
        """The audit (oracle.audit), when it is due: the engine machine's every check."""
        if not self.audit.due():
            return
        found = check(self.adapter.observe(), self.live, self.adapter.block_size)
        if found:
            raise PropertyViolated(name, found)

    def _call(self, name: str, call: Callable[[], object], undo: Callable[[], None] = lambda: None) -> bool:
        """A valid call. False: the engine had no room (then `undo` takes back what the
        machine expected of the call), and must have changed nothing."""
        self.mark = call_starts(self.adapter)
        try:
            call()
        except NoRoom:
            undo()
            type(self).tally.refused += 1
            self._count(name)
            threads.check(name)
            self._check(name)  # the machine forgot the request: it must hold nothing, and no block be lost
            return False
        except PropertyViolated:
            raise
        except BaseException as e:
            if stops(e):
                raise
            raise PropertyViolated(name, [raised_on_valid_call(name, e, NO_ROOM_HINT if name in PLACING else "")]) from e
        self._count(name)
        threads.check(name)
        self._check(name)
        return True

    def _unchanged(self, name: str, before: Observation, how: str) -> None:
        after = self.adapter.observe()
        if after != before:
            raise PropertyViolated(name, [Violation("BAD-INPUT", f"{how}, but the state changed: {_diff(before, after)}")])

    def _forget(self, rid: str) -> None:
        del self.live[rid]
        self.prompts.pop(rid, None)

    def _shrink(self, rid: str, tokens: int) -> None:
        self.live[rid] -= tokens

    def _pick(self, i: int) -> str | None:
        return sorted(self.live)[i % len(self.live)] if self.live else None

    def _pending(self) -> list[str]:
        """The live requests with prompt chunks still to prefill, in order."""
        return sorted(r for r in self.live if self.prompts.get(r))

    def supports(self, op: Op) -> bool:
        return op in self.adapter.operations

    # --- rules -------------------------------------------------------------------------

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(p=st.integers(0, len(PROMPTS) - 1), chunks=st.integers(0, 2))
    def admit(self, p: int, chunks: int) -> None:
        """Admit a prompt; with Op.PREFILL, only its first `chunks` blocks (0: all of it)
        come with the admission, the rest by prefill."""
        if len(self.live) >= MAX_LIVE:
            return
        rid = f"r{self.next_request}"
        self.next_request += 1
        tokens = prompt(p, self.adapter.block_size)
        if self.supports(Op.PREFILL) and chunks:
            cut = min(len(tokens), chunks * self.adapter.block_size)
            tokens, self.prompts[rid] = tokens[:cut], tokens[cut:]
        self.live[rid] = len(tokens)  # before the call: the check after it expects the request
        self._call("admit", lambda: self.adapter.admit(rid, list(tokens)), undo=lambda: self._forget(rid))

    @precondition(lambda self: self.supports(Op.PREFILL) and bool(self._pending()))
    @rule(i=st.integers(0, 7), blocks=st.integers(1, 2))
    def prefill(self, i: int, blocks: int) -> None:
        """The next chunk of a request mid-prefill; the machine chooses whose and how much."""
        pending = self._pending()
        rid = pending[i % len(pending)]
        chunk = self.prompts[rid][: blocks * self.adapter.block_size]
        self.prompts[rid] = self.prompts[rid][len(chunk):]
        self.live[rid] += len(chunk)

        def undo() -> None:
            self._shrink(rid, len(chunk))
            self.prompts[rid] = chunk + self.prompts[rid]

        self._call("prefill", lambda: self.adapter.prefill(rid, list(chunk)), undo=undo)

    @precondition(lambda self: self.supports(Op.GROW) and len(self._pending()) < len(self.live))
    @rule(i=st.integers(0, 7), token=st.integers(1, 2))
    def grow(self, i: int, token: int) -> None:
        rid = self._pick(i)
        if rid is None or self.prompts.get(rid):
            return  # decode follows prefill
        more = [token] * self.adapter.block_size
        self.live[rid] += len(more)
        self._call("grow", lambda: self.adapter.grow(rid, list(more)), undo=lambda: self._shrink(rid, len(more)))

    @precondition(lambda self: bool(self.live))
    @rule(i=st.integers(0, 7))
    def finish(self, i: int) -> None:
        rid = self._pick(i)
        if rid is not None:
            self._finish(rid, "finish")

    def _finish(self, rid: str, name: str) -> None:
        """End `rid`; LIVE-EXIT on it (`name`: the rule's, or the drain's)."""
        before = view_of(self.adapter.observe(), live=self.live)
        del self.live[rid]
        self.prompts.pop(rid, None)
        self.gone.append(rid)
        self._call(name, lambda: self.adapter.finish(rid))
        found = liveness.live_exit(before, view_of(self.adapter.observe(), live=self.live), rid)
        if found:
            raise PropertyViolated(name, found)

    @precondition(lambda self: self.supports(Op.EVICT))
    @rule(blocks=st.integers(1, 4))
    def evict(self, blocks: int) -> None:
        self._call("evict", lambda: self.adapter.evict(blocks))

    @precondition(lambda self: self.with_bad_input and bool(self.adapter.bad_inputs))
    @rule(kind=st.sampled_from(REQUEST_LEVEL), i=st.integers(0, 7))
    def bad_input(self, kind: BadInput, i: int) -> None:
        if kind not in self.adapter.bad_inputs:
            return
        twice = kind in (BadInput.DOUBLE_FINISH, BadInput.DOUBLE_UNLOCK)  # about a finished request
        rid = (self.gone[-1] if self.gone else None) if twice else self._pick(i)
        name = f"bad_input:{kind.value}"
        self.mark = call_starts(self.adapter)
        before = kept(self.adapter.observe())
        try:
            called = self.adapter.bad_input(kind, rid)
        except SystemExit as e:  # not a refusal: a bad request must not end the server
            why = f"the engine exited the process on the bad call {kind.value}: {described(e)}"
            raise PropertyViolated(name, [Violation("VALID-INPUT", why)]) from e
        except Exception:
            type(self).tally.bad_inputs += 1
            self._count(name)
            threads.check(name)
            self._unchanged(name, before, f"{kind.value} was refused")
            return
        if not called:
            return
        type(self).tally.bad_inputs += 1
        self._count(name)
        threads.check(name)
        self._check(name)
        if self.adapter.observe() == before:
            type(self).tally.tolerated += 1
            return
        raise PropertyViolated(name, [Violation("BAD-INPUT", f"{kind.value} was accepted and changed the state: "
                                                             f"{_diff(before, self.adapter.observe())}")])

    # --- LIVE-DRAIN ------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if sys.exc_info()[0] is not None:
                return  # a step already failed: keep its report
            self.audit.draining = True
            drain(self)
            threads.check("the drain")  # a thread that died after the last call
        finally:
            watchdog.pause()
            threads.unwatch()


def drain(m: EngineMachine) -> None:
    """The drain LIVE-DRAIN judges: finish everything, evict everything; every block must be free.
    An adapter that drives no eviction (no Op.EVICT) is judged on what evicting would free:
    the cached blocks nobody holds (oracle.unchecked says so); without `cached`, LIVE-DRAIN
    is not judged."""
    while m.live:
        m._finish(min(m.live), "drain:finish")
    if m.supports(Op.EVICT):
        m._call("drain:evict", lambda: m.adapter.evict(len(m.adapter.observe().ids)))
        after = m.adapter.observe()
    else:
        after = evicted(m.adapter.observe())
    found = liveness.drained(view_of(after))
    if found:
        raise PropertyViolated("drain", found)


def evicted(o: Observation) -> Observation:
    """The observation as evicting every cached block that nobody holds (no reference, no
    transfer reading it) would leave it, once every request has ended: leaves first, then
    their parents, down to the root. The free list unknown where the engine does not say
    what it caches."""
    if o.free is None or o.cached is None:
        return replace(o, free=None)
    refs, read = o.refcounts or {}, set(o.pinned or ())
    idle = frozenset(b for b in o.cached if not refs.get(b, 0) and b not in read)
    return replace(o, free=(*o.free, *sorted(idle)), cached=o.cached - idle, evictable=())


def _diff(a: Observation, b: Observation) -> str:
    parts = [
        f"{f}: {getattr(a, f)!r} -> {getattr(b, f)!r}"
        for f in a.__dataclass_fields__
        if getattr(a, f) != getattr(b, f)
    ]
    return "; ".join(parts)
