"""An exhaustive bounded model check of spec/: breadth-first search from spec's Init
over spec's Next (spec.next), within a stated scope. It has no model of its own: every
step applies spec actions, and every property is spec's predicate on spec's view of
the state.

States are canonicalised before they are stored: block ids are renamed in order of
first appearance in a fixed traversal (interchangeable free blocks collapse), transfer
ids are renumbered densely and time is kept as each transfer's age. That is the
symmetry reduction; requests have distinct prompts, so they are not interchangeable.
What nothing reads any more is left out of the key: how an exited request exited and
what it had computed, a queued request's computed count (`_life`), and whether a block
no live request can reach any more is in storage (`_dead`). States that differ only
there are bisimilar, and the search explores one of each class.

Checked in every reachable state: every safety property that has a meaning on the
abstract state (all but INV-COUNTERS, which judges an implementation's counters, and
INV-CONTENT, which judges bytes), LIVE-TRANSFER on the state's clock, LIVE-EVICT
(when evictable nodes exist, some eviction step evicts one) and LIVE-DRAIN (spec's
drain from the state frees every block within its bound; the longest is reported).
On every step that ends requests: LIVE-EXIT. A violation prints a shortest trace.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from kvoracle.proofs.frontier import Frontier
from kvoracle.spec import liveness
from kvoracle.spec.actions import Evict, PreconditionError, SkipStale
from kvoracle.spec.frozen import replace
from kvoracle.spec.invariants import Violation, check
from kvoracle.spec.next import Next, Scope, Step, describe, evicts, exiting, init
from kvoracle.spec.scheduler import Exit, full_hashes
from kvoracle.spec.state import (
    EXITED,
    QUEUED,
    Heap,
    Holding,
    Node,
    Prefetch,
    Request,
    StorageWrite,
    SwapIn,
    SwapOut,
    System,
    Transfer,
    evictable_nodes,
)
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    GpuBlock,
    OnCpu,
    OnGpu,
    RequestId,
    SwappingIn,
    SwappingOut,
    Tier,
    TierState,
    TransferId,
)
from kvoracle.spec.view import View, of_system, request_name

NOT_MODELLED = ("INV-COUNTERS", "INV-CONTENT")  # the abstract state has no counters and no bytes
# Properties of an engine's choice among Next's steps, which a search of Next cannot judge:
# Next offers every choice, and in every state where a request runs, an exit that ends it.
POLICY = ("LIVE-PROGRESS",)

# --- proof-only mutants of the specification: one action of Next replaced ---------------------


class _HeapDrop(Next):
    """FastDeploy's dropped heap node: a popped stale entry leaves the node flagged, so it
    is never offered again."""

    def apply(self, s: System, step: Step) -> System:
        for e in step:
            if isinstance(e, Evict) and len(e.steps) == 1 and isinstance(e.steps[0], SkipStale):
                h, c = e.steps[0].node, s.cache
                heap = c.gpu_heap if e.steps[0].tier is Tier.GPU else c.cpu_heap
                kept = Heap(heap.entries - {h}, heap.flagged)
                c = replace(c, gpu_heap=kept) if heap is c.gpu_heap else replace(c, cpu_heap=kept)
                s = replace(s, cache=c)
            else:
                s = super().apply(s, (e,))
        return s


class _ExitKeepingBlocks(Exit):
    """An exit whose release never ran."""


def _describe(step: Step) -> str:
    if len(step) == 1 and isinstance(step[0], _ExitKeepingBlocks):
        how = {"finished": "finish", "preempted": "preempt", "aborted": "abort"}[step[0].to.value]
        return f"{how}(r{step[0].request}, write raises: the release is skipped)"
    return describe(step)


class _WriteRaiseSkipsRelease(Next):
    """FastDeploy PR 7807's bug: the storage write raised during the exit, and the code
    after it, which frees the request's blocks, never ran."""

    on: ClassVar[tuple[str, ...]] = ()  # the exits whose release is skipped

    def write_raises(self, s: System, r: object, to: object, writes: object) -> Step:
        step = super().write_raises(s, r, to, writes)  # type: ignore[arg-type]
        first = step[0]
        assert isinstance(first, Exit)
        if first.to.value not in self.on:
            return step
        return (_ExitKeepingBlocks(first.request, first.to, first.writes),)

    def apply(self, s: System, step: Step) -> System:
        if len(step) == 1 and isinstance(step[0], _ExitKeepingBlocks):
            r = step[0].request
            return replace(s, requests={**s.requests, r: replace(s.requests[r], status=step[0].to)})
        return super().apply(s, step)


class _WriteRaiseFinish(_WriteRaiseSkipsRelease):
    on: ClassVar[tuple[str, ...]] = ("finished",)


class _WriteRaisePreempt(_WriteRaiseSkipsRelease):
    on: ClassVar[tuple[str, ...]] = ("preempted",)


MUTATIONS: dict[str, type[Next]] = {
    "heap-drop": _HeapDrop,
    "write-raise-finish": _WriteRaiseFinish,
    "write-raise-preempt": _WriteRaisePreempt,
}

# --- canonical encoding (symmetry reduction over block ids, transfer ids and time) -------------


class Names(dict[int, int]):
    """Block ids -> canonical names, given in order of first appearance (`names[b]`)."""

    def __missing__(self, b: int) -> int:
        self[b] = name = len(self)
        return name


# None's hash is its address before Python 3.12: the form holds -1 instead (ids and hashes
# are >= 0), so that a key is the same in every process with the same PYTHONHASHSEED.
_NONE = -1


def _encode(s: System) -> tuple[tuple[object, ...], Names, Names]:
    """s's canonical form, and the names it gave GPU and CPU blocks (which `relabel` reuses:
    one traversal serves both the key and the representative)."""
    c = s.cache
    gpu, cpu = Names(), Names()
    g, k = gpu.__getitem__, cpu.__getitem__
    nodes = tuple([(h, _NONE if n.parent is None else n.parent, _tier(n.tier, g, k), n.refcount)
                   for h, n in sorted(c.nodes.items())])
    reqs = tuple([(r, held.path, tuple(map(g, held.private))) for r, held in sorted(c.requests.items())])
    trs = tuple([(_transfer(c.transfers[t], g, k), s.now - s.started.get(t, s.now)) for t in sorted(c.transfers)])
    pins = (frozenset([(g(b), n) for b, n in c.gpu_pins.items()]),
            frozenset([(k(b), n) for b, n in c.cpu_pins.items()]))
    requests = sorted(s.requests.items())
    life = tuple([_life(r, q) for r, q in requests])
    heaps = tuple(map(frozenset, (c.gpu_heap.entries, c.gpu_heap.flagged, c.cpu_heap.entries, c.cpu_heap.flagged)))
    stored = c.stored - _dead(tuple([(q.tokens, q.status in EXITED) for _, q in requests]), s.block_size)
    return (life, nodes, reqs, trs, stored, pins, heaps), gpu, cpu


@functools.lru_cache(maxsize=4096)
def _dead(requests: tuple[tuple[tuple[int, ...], bool], ...], block_size: int) -> frozenset[BlockHash]:
    """The block hashes of these requests (their tokens, whether they exited) that no
    request still live can ever have in its chain: a request's tokens only grow, so a
    block whose tokens neither extend a live request's nor are extended by them is out
    of every live request's reach for ever. Whether such a block is in storage changes
    no step (only admission, of a live request, and an exit's write, of its own blocks,
    read storage) and no property (none reads it), so the key leaves it out."""
    live = [tokens for tokens, exited in requests if not exited]
    dead = set()
    for tokens, _ in requests:
        for i, h in enumerate(full_hashes(tokens, block_size)):
            prefix = tokens[: (i + 1) * block_size]
            if not any(_along(prefix, other) for other in live):
                dead.add(h)
    return frozenset(dead)


def _along(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether one of a and b starts the other."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _life(r: RequestId, q: Request) -> tuple[object, ...]:
    """A request as far as any step or property still reads it: an exited request only as
    exited (no step acts on it again, and the view counts it only as not live), a queued
    one without its computed count (admission sets it anew, and the view reads it only
    of running requests). States that differ in nothing else have the same steps, the
    same verdicts and the same successors up to the same difference (tests/test_model_check.py
    checks this on a scope's every state), so the search explores one of them."""
    if q.status in EXITED:
        return (r,)
    if q.status in QUEUED:
        return (r, q.status, q.tokens, q.admissions)
    return (r, q.status, q.tokens, q.computed, q.admissions)


def canonical(s: System) -> tuple[object, ...]:
    return _encode(s)[0]


def _classify(s: System) -> tuple[int, tuple[Names, Names]]:
    """s's key (its digest), and the names its canonical form gave its blocks."""
    form, gpu, cpu = _encode(s)
    return hash(form), (gpu, cpu)


def digest(s: System) -> int:
    """A 64-bit name of s's canonical form: what the search stores per state (Python's
    tuple hash; a collision is a 2^-64 event per pair of states, below 1e-8 for the
    scopes run here)."""
    return hash(canonical(s))


def _tier(t: TierState, g: Callable[[int], int], c: Callable[[int], int]) -> tuple[str, int, int]:
    if isinstance(t, OnGpu):
        return ("g", g(t.gpu), -1)
    if isinstance(t, OnCpu):
        return ("c", -1, c(t.cpu))
    if isinstance(t, SwappingOut):
        return ("o", g(t.gpu), c(t.cpu))
    return ("i", g(t.gpu), c(t.cpu))


def _transfer(t: Transfer, g: Callable[[int], int], c: Callable[[int], int]) -> tuple[object, ...]:
    if isinstance(t, SwapOut):
        return ("o", tuple((h, g(a), c(b)) for h, a, b in t.items))
    if isinstance(t, SwapIn):
        return ("i", _NONE if t.request is None else t.request, tuple((h, c(a), g(b)) for h, a, b in t.items))
    if isinstance(t, StorageWrite):
        return ("w", tuple((h, g(a)) for h, a in t.items), tuple(map(g, t.adopted)))
    return ("p", _NONE if t.request is None else t.request, tuple((h, g(a)) for h, a in t.items))


def relabel(s: System, names: tuple[Names, Names] | None = None) -> System:
    """The representative of s's class: blocks renamed as `canonical` names them (`names`:
    those `_encode` gave s, when the caller has them), free blocks after them, transfers
    renumbered densely, the clock at 0. Exploring representatives keeps the state space
    finite."""
    c = s.cache
    gpu, cpu = names if names is not None else _encode(s)[1:]
    for names_of_tier, size in ((gpu, c.gpu_size), (cpu, c.cpu_size)):
        for free in range(size):
            names_of_tier.setdefault(free, len(names_of_tier))  # blocks nothing holds come last
    tids = {t: TransferId(i) for i, t in enumerate(sorted(c.transfers))}

    def gb(b: GpuBlock) -> GpuBlock:
        return GpuBlock(gpu[b])

    def cb(b: CpuBlock) -> CpuBlock:
        return CpuBlock(cpu[b])

    cache = replace(
        c,
        gpu_free=tuple(sorted(map(gb, c.gpu_free))),
        cpu_free=tuple(sorted(map(cb, c.cpu_free))),
        nodes={h: Node(n.parent, _retier(n.tier, gb, cb), n.refcount) for h, n in c.nodes.items()},
        requests={r: Holding(held.path, tuple(map(gb, held.private))) for r, held in c.requests.items()},
        transfers={tids[t]: _retransfer(tr, gb, cb) for t, tr in c.transfers.items()},
        gpu_pins={gb(b): n for b, n in c.gpu_pins.items()},
        cpu_pins={cb(b): n for b, n in c.cpu_pins.items()},
        next_transfer=len(tids),
    )
    started = {tids[t]: at - s.now for t, at in s.started.items() if t in tids}
    return replace(s, cache=cache, now=0, started=started)


def _retier(t: TierState, gb: Callable[[GpuBlock], GpuBlock], cb: Callable[[CpuBlock], CpuBlock]) -> TierState:
    if isinstance(t, OnGpu):
        return OnGpu(gb(t.gpu))
    if isinstance(t, OnCpu):
        return OnCpu(cb(t.cpu))
    if isinstance(t, SwappingOut):
        return SwappingOut(gb(t.gpu), cb(t.cpu))
    return SwappingIn(cb(t.cpu), gb(t.gpu))


def _retransfer(t: Transfer, gb: Callable[[GpuBlock], GpuBlock], cb: Callable[[CpuBlock], CpuBlock]) -> Transfer:
    if isinstance(t, SwapOut):
        return SwapOut(tuple((h, gb(a), cb(b)) for h, a, b in t.items))
    if isinstance(t, SwapIn):
        return SwapIn(t.request, tuple((h, cb(a), gb(b)) for h, a, b in t.items))
    if isinstance(t, StorageWrite):
        return StorageWrite(tuple((h, gb(a)) for h, a in t.items), tuple(map(gb, t.adopted)))
    return Prefetch(t.request, tuple((h, gb(a)) for h, a in t.items))


# --- the properties of a state and of a step -----------------------------------------------------


def state_violations(enabled: Sequence[Step], s: System, v: View) -> list[Violation]:
    """The properties of state s, whose view is v and whose enabled steps are `enabled`."""
    found = check(v) + liveness.live_transfer(s.started, s.now, s.timeout)
    if evictable_nodes(s.cache)[0]:
        progress = next((step for step in enabled if evicts(step)), ())
        steps = [x for e in progress if isinstance(e, Evict) for x in e.steps]
        found += liveness.live_evict(s.cache, 0, 1, steps)
    return found


def admit_violations(model: Next, enabled: Sequence[Step], s: System, v: View) -> list[Violation]:
    """LIVE-ADMIT in state s: when it is idle and a request that fits waits (one the scope
    still lets in), some enabled step admits a request, starts a transfer or frees a block;
    if every step stalls, every run from s stalls for ever."""
    flying, room, needs = len(s.cache.transfers), s.cache.gpu_size, liveness.needs(s, model.scope.admissions)
    why = liveness.stall(v, v, needs, room, (flying, flying))
    if why is None:
        return []
    for step in enabled:
        nxt = model.apply(s, step)
        if liveness.stall(v, of_system(nxt), needs, room, (flying, len(nxt.cache.transfers))) is None:
            return []
    return liveness.live_admit([why] * (liveness.ADMIT_GRACE + 1))


def step_violations(step: Step, before: View, after: View) -> list[Violation]:
    return [v for r in exiting(step) for v in liveness.live_exit(before, after, request_name(r))]


# --- the search ----------------------------------------------------------------------------------


@dataclass
class Report:
    scope: Scope
    mutation: str
    states: int
    transitions: int
    seconds: float
    longest_drain: int
    violation: list[Violation]
    trace: list[str]
    complete: bool  # False when max_states cut the search short
    stored_bytes: int = 0  # what the visited set and the drain memo hold at the end (stored_bytes_of)

    @property
    def passed(self) -> bool:
        return not self.violation and self.complete

    @property
    def rate(self) -> float:
        return self.states / self.seconds if self.seconds else 0.0

    @property
    def bytes_per_state(self) -> float:
        return self.stored_bytes / self.states if self.states else 0.0


def explore(scope: Scope, mutation: str = "", max_states: int = 2_000_000,
            progress: Callable[[int, int], None] | None = None) -> Report:
    """Breadth-first search of every reachable state of the scope; stops at the first
    violation (whose trace is then a shortest one)."""
    with no_cycle_collection():
        return _search(scope, mutation, max_states, progress)


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """States are frozen dataclasses, tuples and dicts: the search builds no reference
    cycles, and the cycle collector would only rescan its ever larger frontier."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _search(scope: Scope, mutation: str, max_states: int, progress: Callable[[int, int], None] | None) -> Report:
    model = model_of(scope, mutation)
    start = time.perf_counter()
    first = relabel(init(scope))
    root = digest(first)
    parents: dict[int, int | None] = {root: None}  # each visited state's key -> its parent's
    queue: Frontier[tuple[int, System]] = Frontier()  # each state with its key
    queue.append((root, first))
    drains: dict[int, int] = {}
    bound = liveness.drain_bound(scope.gpu_blocks, scope.cpu_blocks, scope.requests)
    transitions = longest = 0

    def report(found: list[Violation], trace: list[str], complete: bool = True) -> Report:
        return Report(scope, mutation, len(parents), transitions, time.perf_counter() - start, longest, found,
                      trace, complete, stored_bytes_of(parents, drains))

    while queue:
        key, s = queue.popleft()
        v = visit(model, s, key, drains, bound)
        transitions += len(v.successors) + (v.last_step is not None)
        if v.violation:
            if v.last_step is not None:
                parents.setdefault(v.last_key, key)
            return report(v.violation, v.trace(replay(model, key_path(parents.__getitem__, key))))
        longest = max(longest, v.drained)
        for k, names, nxt in v.successors:
            if k not in parents:
                parents[k] = key
                queue.append((k, relabel(nxt, names)))
        if progress is not None and len(parents) % 5000 < 40:
            progress(len(parents), len(queue))
        if len(parents) > max_states:
            return report([], [], complete=False)
    return report([], [])


def model_of(scope: Scope, mutation: str) -> Next:
    return MUTATIONS[mutation](scope) if mutation else Next(scope)


@dataclass
class Visit:
    """What one state's visit found: its violations, or the steps out of it."""

    violation: list[Violation]
    drained: int = 0  # the steps spec's drain takes from the state to all-free
    successors: list[tuple[int, tuple[Names, Names], System]] = field(default_factory=list)  # key, names, state
    last_step: str | None = None  # a step that violates a step property (LIVE-EXIT), described
    last_key: int = 0  # and the key of the state it reaches

    def trace(self, to_state: list[str]) -> list[str]:
        """The counterexample, given the trace to the visited state: a step violation's
        ends with the violating step, whatever first reached the state after it."""
        return to_state if self.last_step is None else [*to_state, self.last_step]


def visit(model: Next, s: System, key: int, drains: dict[int, int], bound: int) -> Visit:
    """Check state s (whose key is `key`) and every step out of it, up to the first
    violation; the successors come with their keys and the names `relabel` needs."""
    view = of_system(s)
    enabled = list(model.enabled(s))
    found = state_violations(enabled, s, view) or admit_violations(model, enabled, s, view)
    if found:
        return Visit(found)
    drained = _drain(s, key, drains, bound)
    if drained < 0:
        return Visit(liveness.live_drain(s, bound))
    out = Visit([], drained)
    for step, nxt in _successors(model, s, enabled):
        k, names = _classify(nxt)
        if exiting(step):
            exit_found = step_violations(step, view, of_system(nxt))
            if exit_found:
                out.violation, out.last_step, out.last_key = exit_found, _describe(step), k
                return out
        out.successors.append((k, names, nxt))
    return out


def _successors(model: Next, s: System, enabled: Iterable[Step]) -> Iterator[tuple[Step, System]]:
    for step in enabled:
        try:
            yield step, model.apply(s, step)
        except PreconditionError as e:  # Next offered a step its own actions refuse: a bug in spec/
            raise AssertionError(f"spec/next.py offered {describe(step)}, which is not enabled: {e}") from e


def _drain(s: System, key: int, memo: dict[int, int], bound: int) -> int:
    """Steps spec's drain takes from s (whose digest is `key`) to all-free, or -1 if it
    gets stuck or exceeds `bound`."""
    path: list[int] = []
    cur: System | None = s
    result = -1
    while cur is not None:
        if key in memo:
            result = memo[key] if memo[key] < 0 else memo[key] + len(path)
            break
        path.append(key)
        if len(path) > bound:
            break
        nxt = liveness.drain_step(cur)
        if nxt is None:
            result = len(path) - 1 if not liveness.drained(of_system(cur), len(cur.cache.transfers)) else -1
            break
        cur, key = nxt, digest(nxt)
    for i, k in enumerate(path):
        memo[k] = result - i if result >= 0 else -1
    return result


def key_path(parent_of: Callable[[int], int | None], key: int) -> list[int]:
    """The keys of the states on the search's path from Init to `key`, Init first."""
    path: list[int] = []
    cur: int | None = key
    while cur is not None:
        path.append(cur)
        cur = parent_of(cur)
    return path[::-1]


def replay(model: Next, path: Sequence[int]) -> list[str]:
    """The steps of a path of keys from Init. The search keeps only parent links;
    replaying Next along them recovers the step that first reached each state (the
    first, in Next's order, from its parent's representative)."""
    s, out = relabel(init(model.scope)), []
    for k in path[1:]:
        for step, nxt in _successors(model, s, model.enabled(s)):
            found, names = _classify(nxt)
            if found == k:
                out.append(_describe(step))
                s = relabel(nxt, names)
                break
        else:
            raise AssertionError(f"no step of Next reaches the recorded state {k:#x}: the search's parents are corrupt")
    return out


def stored_bytes_of(parents: dict[int, int | None], drains: dict[int, int]) -> int:
    """The bytes of the two tables the search keeps for every state it visits: the dicts,
    and the key ints, once each (a drain key is often a visited state's, the same int)."""
    ints = {id(k): k for table in (parents, drains) for k in table}
    return sys.getsizeof(parents) + sys.getsizeof(drains) + sum(map(sys.getsizeof, ints.values()))
