"""Next: every step a scheduler may take from a system state, with every choice the
specification leaves open, within a bounded scope. The model checker explores it;
a step is a short tuple of events (spec.scheduler.Event) applied atomically, which is
how a scheduler takes them (an admission is one step, whatever it matched).

Choices of *which* free block an action takes are not enumerated: block ids are
interchangeable, and the model checker's symmetry reduction identifies states that
differ only in them. Everything else is: which request, how many CPU and storage
hits to take, chunk sizes, whether an exit writes, how every transfer ends, which
heap entry eviction pops.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kvoracle.spec import actions, scheduler
from kvoracle.spec.actions import Complete, Drop, Evict, EvictCpu, EvictStep, Reset, SkipStale, SwapOutTo
from kvoracle.spec.scheduler import Admit, Decode, Event, Exit, Insert, Prefill, Tick
from kvoracle.spec.state import (QUEUED, CacheState, Status, System, blocks_for, cpu_evictable, due, gpu_evictable,
                                 initial_system)
from kvoracle.spec.types import (
    BlockHash,
    Error,
    GpuBlock,
    Ok,
    OnCpu,
    Outcome,
    Partial,
    RequestId,
    Tier,
    Timeout,
    TransferId,
    describe as describe_outcome,
)

Step = tuple[Event, ...]


@dataclass(frozen=True)
class Scope:
    gpu_blocks: int = 6
    cpu_blocks: int = 2
    storage: bool = True
    requests: int = 3
    prompt_blocks: int = 2  # full blocks per prompt (block size 1)
    alphabet: int = 2  # tokens 1..alphabet
    admissions: int = 2  # times a request may be admitted (1: no re-admission after preempt)
    decode: int = 0  # tokens a request may decode
    timeout: int = 1  # ticks before an unanswered transfer is timed out
    chunked: bool = False  # prefill in chunks after admission (False: admission prefills the whole prompt)

    def prompts(self) -> list[tuple[int, ...]]:
        """Distinct prompts that share prefixes: the first `requests` sequences in order."""
        out: list[tuple[int, ...]] = []
        for i in range(min(self.requests, self.alphabet ** self.prompt_blocks)):
            tokens, n = [], i
            for _ in range(self.prompt_blocks):
                tokens.append(1 + n % self.alphabet)
                n //= self.alphabet
            out.append(tuple(tokens[::-1]))
        return out

    def describe(self) -> str:
        """Compact: G6 C2 S R3x2/2 A1 = 6 GPU, 2 CPU blocks, storage on, 3 requests of
        2 blocks over 2 tokens, admitted at most once each (D1: one decoded token)."""
        extra = (f" D{self.decode}" if self.decode else "") + (" chunked" if self.chunked else "")
        return (f"G{self.gpu_blocks} C{self.cpu_blocks} {'S' if self.storage else 'noS'} "
                f"R{self.requests}x{self.prompt_blocks}/{self.alphabet} A{self.admissions}{extra}")


def init(scope: Scope) -> System:
    """Init within the scope: every prompt submitted, nothing else has happened."""
    s = initial_system(scope.gpu_blocks, scope.cpu_blocks, 1, scope.timeout)
    for r, tokens in enumerate(scope.prompts()):
        s = scheduler.submit(s, RequestId(r), tokens)
    return s


def outcomes(items: int) -> tuple[Outcome, ...]:
    """One outcome per distinct effect on the state: how many leading items succeeded
    (0: error, and a timeout or partial(0) does the same; all: ok). Timeouts as such
    come with ticks."""
    return (Error(), *(Partial(k) for k in range(1, items)), Ok())


class Next:
    """The enabled steps of a state. `apply` is the one place a step's events take
    effect; a proof-only mutant of the specification overrides one action there."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.prompt_len = scope.prompt_blocks  # block size 1: tokens = blocks

    def apply(self, s: System, step: Step) -> System:
        for e in step:
            s = scheduler.apply(s, e)
        return s

    def steps(self, s: System) -> Iterator[tuple[Step, System]]:
        for step in self.enabled(s):
            yield step, self.apply(s, step)

    def enabled(self, s: System) -> Iterator[Step]:
        for r, q in sorted(s.requests.items()):
            if q.status in QUEUED:
                yield from self._admits(s, r)
                if q.admissions > 0:
                    yield (Exit(r, Status.ABORTED),)
            elif q.status is Status.RUNNING:
                yield from self._running(s, r)
        for t, tr in sorted(s.cache.transfers.items()):
            for outcome in outcomes(len(tr.items)):
                yield (Complete(t, outcome),)
        if s.cache.transfers:
            yield self._tick(s)
        yield from self._evictions(s.cache)
        if all(q.status is not Status.RUNNING for q in s.requests.values()) and (s.cache.nodes or s.cache.transfers):
            yield (Reset(),)

    # --- requests --------------------------------------------------------------------------

    def _admits(self, s: System, r: RequestId) -> Iterator[Step]:
        if s.requests[r].admissions >= self.scope.admissions:
            return
        c, want = s.cache, scheduler.hashes(s, r)
        hits = actions.gpu_hits(c, want)
        cpu_run = _cpu_run(c, want, hits)
        store_run = _store_run(c, want, hits + cpu_run) if self.scope.storage else 0
        free, prompt = list(c.gpu_free), len(s.requests[r].tokens)
        for k in range(min(cpu_run, len(free)) + 1):
            for j in range(min(store_run, len(free) - k) + 1 if k == cpu_run else 1):
                admit = Admit(r, tuple(free[:k]), tuple(free[k:k + j]))
                if self.scope.chunked:
                    yield (admit,)
                    continue
                rest = free[k + j:k + j + prompt - hits - k - j]  # block size 1: a block per token
                if hits + k + j == prompt:
                    yield (admit,)
                elif len(rest) == prompt - hits - k - j:  # all or nothing: the whole prompt fits
                    yield (admit, Prefill(r, prompt - hits - k - j, tuple(rest)))

    def _running(self, s: System, r: RequestId) -> Iterator[Step]:
        c, q = s.cache, s.requests[r]
        held = len(actions.table(c, r))
        for chunk in range(1, len(q.tokens) - q.computed + 1) if self.scope.chunked else ():
            need = blocks_for(q.computed + chunk, s.block_size) - held
            if need <= len(c.gpu_free):
                yield (Prefill(r, chunk, tuple(c.gpu_free[:max(0, need)])),)
        ready = actions.ready(c, r)
        done = q.computed == len(q.tokens)
        if ready and done and len(q.tokens) < self.prompt_len + self.scope.decode:
            need = blocks_for(len(q.tokens) + 1, s.block_size) - held
            if need <= len(c.gpu_free):
                yield (Decode(r, 1, tuple(c.gpu_free[:max(0, need)])),)
        full = q.computed // s.block_size
        if ready and full and actions.commit(c, r, scheduler.hashes(s, r)[:full]) != c:
            yield (Insert(r, full),)
        yield (Exit(r, Status.ABORTED),)
        exits = [Status.FINISHED] if done else []
        if q.admissions < self.scope.admissions:
            exits.append(Status.PREEMPTED)
        writes = self._writes(s, r) if self.scope.storage else ()
        for to in exits:
            yield (Exit(r, to),)
            if writes:
                yield (Exit(r, to, writes),)
                yield self.write_raises(s, r, to, writes)

    def write_raises(self, s: System, r: RequestId, to: Status, writes: tuple[tuple[BlockHash, GpuBlock], ...]) -> Step:
        """An exit whose storage write raises as it starts: the exit happens, and the write
        is an error answered at once."""
        return (Exit(r, to, writes), Complete(TransferId(s.cache.next_transfer), Error()))

    def _writes(self, s: System, r: RequestId) -> tuple[tuple[BlockHash, GpuBlock], ...]:
        c = s.cache
        if not actions.ready(c, r):
            return ()
        computed = s.requests[r].computed // s.block_size
        pairs = zip(scheduler.hashes(s, r)[:computed], actions.table(c, r))
        return tuple((h, g) for h, g in pairs if h not in c.stored)

    def _tick(self, s: System) -> Step:
        """Time passes one tick; every transfer that reaches its timeout is timed out."""
        expired = [t for t, at in sorted(s.started.items()) if due(at, s.now + 1, s.timeout)]
        return (Tick(1), *(Complete(t, Timeout()) for t in expired))

    # --- eviction --------------------------------------------------------------------------

    def _evictions(self, c: CacheState) -> Iterator[Step]:
        for h in sorted(c.gpu_heap.entries):
            for steps in self._gpu_evictions(c, h):
                yield (Evict(steps),)
        for h in sorted(c.cpu_heap.entries):
            yield (Evict((EvictCpu(h) if cpu_evictable(c, h) else SkipStale(h, Tier.CPU),)),)

    @staticmethod
    def _gpu_evictions(c: CacheState, h: BlockHash) -> Iterator[tuple[EvictStep, ...]]:
        if not gpu_evictable(c, h):
            yield (SkipStale(h, Tier.GPU),)
            return
        if c.cpu_free:
            yield (SwapOutTo(h, c.cpu_free[0]),)
            return
        room = [x for x in sorted(c.cpu_heap.entries) if cpu_evictable(c, x)]
        for x in room:
            tier = c.nodes[x].tier
            assert isinstance(tier, OnCpu)
            yield (EvictCpu(x), SwapOutTo(h, tier.cpu))
        if not any(cpu_evictable(c, x) for x in c.nodes):
            yield (Drop(h),)


def evicts(step: Step) -> bool:
    """The step evicts a GPU node (not only stale entries)."""
    return any(isinstance(e, Evict) and any(isinstance(x, SwapOutTo | Drop) for x in e.steps) for e in step)


def exiting(step: Step) -> list[RequestId]:
    return [e.request for e in step if isinstance(e, Exit)]


def describe(step: Step) -> str:
    """A step in words, for counterexamples."""
    return " + ".join(_event_text(e) for e in step)


def _event_text(e: Event) -> str:
    if isinstance(e, Admit):
        return f"admit(r{e.request}, swap_in={len(e.swap_dests)}, prefetch={len(e.prefetch_dests)})"
    if isinstance(e, Prefill):
        return f"prefill(r{e.request}, {e.tokens} tokens)"
    if isinstance(e, Decode):
        return f"decode(r{e.request})"
    if isinstance(e, Insert):
        return f"insert(r{e.request}, {e.blocks} blocks)"
    if isinstance(e, Exit):
        how = {Status.FINISHED: "finish", Status.ABORTED: "abort", Status.PREEMPTED: "preempt"}[e.to]
        return f"{how}(r{e.request}{', write ' + str(len(e.writes)) + ' blocks' if e.writes else ''})"
    if isinstance(e, Complete):
        return f"complete(t{e.transfer}, {describe_outcome(e.outcome)})"
    if isinstance(e, Evict):
        return "evict(" + ", ".join(_evict_text(x) for x in e.steps) + ")"
    if isinstance(e, Tick):
        return f"tick({e.ticks})"
    return type(e).__name__.lower()


def _evict_text(x: EvictStep) -> str:
    if isinstance(x, SwapOutTo):
        return f"{x.node:#x} -> cpu {x.cpu}"
    if isinstance(x, Drop):
        return f"drop {x.node:#x}"
    if isinstance(x, EvictCpu):
        return f"cpu {x.node:#x}"
    return f"stale {x.node:#x} ({x.tier.value})"


def _cpu_run(s: CacheState, hashes: tuple[BlockHash, ...], start: int) -> int:
    n, parent = 0, hashes[start - 1] if start else None
    for h in hashes[start:]:
        node = s.nodes.get(h)
        if node is None or node.parent != parent or not isinstance(node.tier, OnCpu):
            break
        n, parent = n + 1, h
    return n


def _store_run(s: CacheState, hashes: tuple[BlockHash, ...], start: int) -> int:
    n = 0
    for h in hashes[start:]:
        if h not in s.stored:
            break
        n += 1
    return n

