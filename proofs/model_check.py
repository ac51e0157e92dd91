"""An exhaustive bounded model check of spec/: breadth-first search from the initial
state over every action and every nondeterministic outcome, within a stated scope.

The model is spec/'s cache state plus what the scheduler and the implementation add
to it: request statuses (waiting, running, finished, with a bound on admissions, so
preemption is modelled) and the LRU heaps with lazy deletion (an entry set and an
`in_heap` flag set per tier; which entry eviction pops is a nondeterministic choice,
so the check holds for every eviction order, LRU included).

States are canonicalised before they are stored: block ids are renamed in order of
first appearance in a fixed traversal (interchangeable free blocks collapse), and
transfer ids are renumbered densely. That is the symmetry reduction over block ids;
requests have distinct prompts, so they are not interchangeable.

Checked: every invariant of spec/ (INV-*) and INV-REQUEST in every reachable state,
and LIVE-DRAIN from every reachable state (abort everything, time out every
transfer but the swap-outs eviction itself needs, evict everything: all blocks free,
within a bound; the longest drain is reported). A violation prints the shortest trace from the initial state.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from kvoracle.spec import actions
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation, check
from kvoracle.spec.scheduler import live_exit_cache
from kvoracle.spec.state import (
    CacheState,
    Holding,
    Node,
    Observed,
    Prefetch,
    StorageWrite,
    SwapIn,
    SwapOut,
    Transfer,
    cpu_evictable,
    gpu_evictable,
    initial,
    true_counters,
)
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    Error,
    GpuBlock,
    OnCpu,
    OnGpu,
    Ok,
    Outcome,
    Partial,
    RequestId,
    SwappingIn,
    SwappingOut,
    TierState,
    Timeout,
    TransferId,
)

WAITING, RUNNING, DONE = "w", "r", "f"


@dataclass(frozen=True)
class Scope:
    gpu_blocks: int = 6
    cpu_blocks: int = 2
    storage: bool = True
    requests: int = 3
    prompt_blocks: int = 2  # full blocks per prompt (block size 1)
    alphabet: int = 2  # tokens 1..alphabet
    admissions: int = 2  # times a request may be admitted (1: no re-admission after preempt)

    def prompts(self) -> list[tuple[BlockHash, ...]]:
        """Distinct prompts that share prefixes: the first `requests` sequences in order."""
        out: list[tuple[BlockHash, ...]] = []
        for i in range(self.alphabet**self.prompt_blocks):
            if len(out) == self.requests:
                break
            tokens, n = [], i
            for _ in range(self.prompt_blocks):
                tokens.append(1 + n % self.alphabet)
                n //= self.alphabet
            out.append(block_hashes(tokens[::-1], 1))
        return out

    def describe(self) -> str:
        """Compact: G6 C2 S R3x2/2 A1 = 6 GPU, 2 CPU blocks, storage on, 3 requests of
        2 blocks over 2 tokens, admitted at most once each."""
        return (f"G{self.gpu_blocks} C{self.cpu_blocks} {'S' if self.storage else 'noS'} "
                f"R{self.requests}x{self.prompt_blocks}/{self.alphabet} A{self.admissions}")


@dataclass(frozen=True)
class MState:
    cache: CacheState
    status: tuple[str, ...]
    admitted: tuple[int, ...]
    heap: tuple[frozenset[BlockHash], frozenset[BlockHash]]  # entries per tier (GPU, CPU)
    flag: tuple[frozenset[BlockHash], frozenset[BlockHash]]  # in_heap flags per tier


@dataclass(frozen=True)
class Mutation:
    """A mutated model: the seed bugs, in the model checker's terms."""

    stale_keeps_flag: bool = False  # seed bug a: a stale heap entry is dropped, its flag kept
    raise_skips_release_on: tuple[str, ...] = ()  # seed bug b: "finish" / "preempt" write raise skips the free


MUTATIONS = {
    "heap-drop": Mutation(stale_keeps_flag=True),
    "write-raise-finish": Mutation(raise_skips_release_on=("finish",)),
    "write-raise-preempt": Mutation(raise_skips_release_on=("preempt",)),
}


# --- the model's transitions --------------------------------------------------------------


class Model:
    def __init__(self, scope: Scope, mutation: Mutation = Mutation()) -> None:
        self.scope = scope
        self.mutation = mutation
        self.prompts = scope.prompts()

    def initial(self) -> MState:
        n = len(self.prompts)
        none: frozenset[BlockHash] = frozenset()
        return MState(initial(self.scope.gpu_blocks, self.scope.cpu_blocks), (WAITING,) * n, (0,) * n,
                      (none, none), (none, none))

    def successors(self, m: MState) -> Iterator[tuple[str, MState]]:
        yield from self._admits(m)
        for r, st in enumerate(m.status):
            if st == RUNNING:
                yield from self._running_moves(m, RequestId(r))
            elif st == WAITING and m.admitted[r] > 0:
                yield f"abort(r{r})", self._set(m, r, DONE)
        for t, tr in sorted(m.cache.transfers.items()):
            for label, outcome in _outcomes(tr):
                yield f"complete(t{t}, {label})", self._settle(replace(m, cache=actions.complete(m.cache, t, outcome)))
        yield from self._evictions(m)
        if RUNNING not in m.status and (m.cache.nodes or m.cache.transfers):
            yield "reset", self._settle(replace(m, cache=actions.reset(m.cache)))

    def _admits(self, m: MState) -> Iterator[tuple[str, MState]]:
        s = m.cache
        for r, st in enumerate(m.status):
            if st != WAITING or m.admitted[r] >= self.scope.admissions:
                continue
            hashes = self.prompts[r]
            hits = actions.gpu_hits(s, hashes)
            cpu_run = _cpu_run(s, hashes, hits)
            store_run = _store_run(s, hashes, hits + cpu_run) if self.scope.storage else 0
            for k in range(cpu_run + 1):
                for j in range(store_run + 1 if k == cpu_run else 1):
                    need = len(hashes) - hits
                    if need > len(s.gpu_free):
                        continue
                    free = list(s.gpu_free)
                    c = actions.match(s, RequestId(r), hashes, free[:k], free[k : k + j])
                    c = actions.allocate(c, RequestId(r), free[k + j : need])
                    m2 = replace(m, cache=c, admitted=_bump(m.admitted, r))
                    yield f"admit(r{r}, swap_in={k}, prefetch={j})", self._settle(self._set(m2, r, RUNNING))

    def _running_moves(self, m: MState, r: RequestId) -> Iterator[tuple[str, MState]]:
        s = m.cache
        hashes = self.prompts[r]
        if actions.ready(s, r):
            c = actions.commit(s, r, hashes)
            if c != s:
                yield f"commit(r{r})", self._settle(replace(m, cache=c))
        yield f"abort(r{r})", self._exit(m, r, DONE, writes=())
        for how, to in (("finish", DONE), ("preempt", WAITING)):
            if to == WAITING and m.admitted[r] >= self.scope.admissions:
                continue
            yield f"{how}(r{r})", self._exit(m, r, to, writes=())
            writes = self._writes(s, r) if self.scope.storage else ()
            if writes:
                yield f"{how}(r{r}, write)", self._exit(m, r, to, writes)
                yield f"{how}(r{r}, write raises)", self._exit_raising(m, r, to, writes, how)

    def _writes(self, s: CacheState, r: RequestId) -> tuple[tuple[BlockHash, GpuBlock], ...]:
        if not actions.ready(s, r):
            return ()
        return tuple((h, g) for h, g in zip(self.prompts[r], actions.table(s, r)) if h not in s.stored)

    def _exit(self, m: MState, r: RequestId, to: str, writes: tuple[tuple[BlockHash, GpuBlock], ...]) -> MState:
        return self._settle(self._set(replace(m, cache=actions.release(m.cache, r, writes)), r, to))

    def _exit_raising(self, m: MState, r: RequestId, to: str, writes: tuple[tuple[BlockHash, GpuBlock], ...],
                      how: str) -> MState:
        """The write raises synchronously: the reference turns it into an error answer
        after the release; the seed-bug-b mutation leaves the request's blocks held."""
        if how in self.mutation.raise_skips_release_on:
            return self._set(m, r, to)
        after = self._exit(m, r, to, writes)
        t = TransferId(m.cache.next_transfer)
        return self._settle(replace(after, cache=actions.complete(after.cache, t, Error())))

    def _evictions(self, m: MState) -> Iterator[tuple[str, MState]]:
        s = m.cache
        for h in sorted(m.heap[0]):
            if not gpu_evictable(s, h):
                yield f"evict_gpu(pops stale {h:#x})", self._stale(m, 0, h)
                continue
            tier = s.nodes[h].tier
            assert isinstance(tier, OnGpu)
            if s.cpu_free:
                step: list[actions.EvictStep] = [actions.SwapOutTo(h, s.cpu_free[0])]
                yield f"evict_gpu({h:#x} -> cpu)", self._evicted(m, 0, h, step)
                continue
            room = [c for c in sorted(m.heap[1]) if cpu_evictable(s, c)]
            for c in room:
                cpu_node = s.nodes[c].tier
                assert isinstance(cpu_node, OnCpu)
                steps: list[actions.EvictStep] = [actions.EvictCpu(c), actions.SwapOutTo(h, cpu_node.cpu)]
                yield f"evict_gpu({h:#x} -> cpu, evicting {c:#x})", self._evicted(m, 0, h, steps, also=c)
            if not room and not any(cpu_evictable(s, c) for c in s.nodes):
                yield f"evict_gpu(drop {h:#x})", self._evicted(m, 0, h, [actions.Drop(h)])
        for h in sorted(m.heap[1]):
            if cpu_evictable(s, h):
                yield f"evict_cpu({h:#x})", self._evicted(m, 1, h, [actions.EvictCpu(h)])
            else:
                yield f"evict_cpu(pops stale {h:#x})", self._stale(m, 1, h)

    def _evicted(self, m: MState, tier: int, h: BlockHash, steps: list[actions.EvictStep],
                 also: BlockHash | None = None) -> MState:
        heap, flag = list(m.heap), list(m.flag)
        heap[tier], flag[tier] = heap[tier] - {h}, flag[tier] - {h}
        if also is not None:
            heap[1], flag[1] = heap[1] - {also}, flag[1] - {also}
        return self._settle(replace(m, cache=actions.evict(m.cache, steps), heap=_pair(heap), flag=_pair(flag)))

    def _stale(self, m: MState, tier: int, h: BlockHash) -> MState:
        heap, flag = list(m.heap), list(m.flag)
        heap[tier] = heap[tier] - {h}
        if not self.mutation.stale_keeps_flag:
            flag[tier] = flag[tier] - {h}  # offered again when it next becomes evictable
        return self._settle(replace(m, heap=_pair(heap), flag=_pair(flag)))

    def _settle(self, m: MState) -> MState:
        """After a step: forget dead nodes' entries; offer every evictable, unflagged node."""
        s = m.cache
        heap, flag = [set(m.heap[0]), set(m.heap[1])], [set(m.flag[0]), set(m.flag[1])]
        for tier, evictable in ((0, gpu_evictable), (1, cpu_evictable)):
            heap[tier] &= set(s.nodes)
            flag[tier] &= set(s.nodes)
            for h in s.nodes:
                if evictable(s, h) and h not in flag[tier]:
                    heap[tier].add(h)
                    flag[tier].add(h)
        return replace(m, heap=(frozenset(heap[0]), frozenset(heap[1])), flag=(frozenset(flag[0]), frozenset(flag[1])))

    @staticmethod
    def _set(m: MState, r: int, to: str) -> MState:
        return replace(m, status=m.status[:r] + (to,) + m.status[r + 1 :])

    # --- properties -----------------------------------------------------------------------

    def violations(self, m: MState) -> list[Violation]:
        s = m.cache
        observed = Observed(m.heap[0], m.heap[1], true_counters(s))
        found = check(s, observed)
        for r, st in enumerate(m.status):
            if (RequestId(r) in s.requests) != (st == RUNNING):
                found.append(Violation("INV-REQUEST", f"request r{r} is {st!r} but {'holds' if st != RUNNING else 'lacks'} blocks"))
        for tier in (0, 1):
            if not m.heap[tier] <= m.flag[tier]:
                found.append(Violation("INV-HEAP-SOUND", "a heap entry without its in_heap flag"))
        if any(gpu_evictable(s, h) for h in s.nodes) and not any(
            "stale" not in label for label, _ in self._evictions(m) if label.startswith("evict_gpu")
        ):
            found.append(Violation("LIVE-EVICT", "evictable GPU nodes exist but no eviction can take one"))
        return found

    def exit_violations(self, label: str, before: MState, after: MState) -> list[Violation]:
        """LIVE-EXIT on a finish / preempt / abort transition."""
        if not label.startswith(("finish", "preempt", "abort")):
            return []
        r = RequestId(int(label.split("(r", 1)[1].split(")")[0].split(",")[0]))
        return live_exit_cache(before.cache, after.cache, r)

    def drain_step(self, m: MState) -> MState | None:
        """One deterministic step of the drain, or None when there is nothing left to do."""
        for r, st in enumerate(m.status):
            if st == RUNNING:
                return self._exit(m, RequestId(r), DONE, ())
        if m.cache.transfers:  # every transfer times out, but a swap-out eviction needs succeeds
            t = min(m.cache.transfers)
            outcome: Outcome = Ok() if isinstance(m.cache.transfers[t], SwapOut) else Timeout()
            return self._settle(replace(m, cache=actions.complete(m.cache, t, outcome)))
        for label, nxt in self._evictions(m):
            if "stale" in label or "drop" in label or "->" in label or "evict_cpu" in label:
                return nxt
        return None


def _outcomes(tr: Transfer) -> list[tuple[str, Outcome]]:
    n = len(tr.items)
    out: list[tuple[str, Outcome]] = [("ok", Ok()), ("error", Error()), ("timeout", Timeout())]
    return out + [(f"partial({k})", Partial(k)) for k in range(1, n)]


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


def _bump(t: tuple[int, ...], i: int) -> tuple[int, ...]:
    return t[:i] + (t[i] + 1,) + t[i + 1 :]


def _pair(xs: list[frozenset[BlockHash]]) -> tuple[frozenset[BlockHash], frozenset[BlockHash]]:
    return xs[0], xs[1]


# --- canonical encoding (symmetry reduction over block ids) ----------------------------------


class _Renamer:
    def __init__(self) -> None:
        self.names: dict[int, int] = {}

    def __call__(self, b: int) -> int:
        return self.names.setdefault(b, len(self.names))


def digest(m: MState) -> bytes:
    """A 128-bit name of m's canonical form: what the search stores per state (a few
    dozen bytes instead of the whole tuple; a collision is a 2^-128 event per pair)."""
    return hashlib.blake2b(repr(canonical(m)).encode(), digest_size=16).digest()


def canonical(m: MState) -> tuple[object, ...]:
    s = m.cache
    g, c = _Renamer(), _Renamer()
    nodes = tuple((h, n.parent, _tier(n.tier, g, c), n.refcount) for h, n in sorted(s.nodes.items()))
    reqs = tuple((r, held.path, tuple(g(b) for b in held.private)) for r, held in sorted(s.requests.items()))
    trs = tuple(_transfer(s.transfers[t], g, c) for t in sorted(s.transfers))
    pins = (tuple(sorted((g(b), k) for b, k in s.gpu_pins.items())), tuple(sorted((c(b), k) for b, k in s.cpu_pins.items())))
    return (m.status, m.admitted, nodes, reqs, trs, tuple(sorted(s.stored)), pins,
            tuple(sorted(m.heap[0])), tuple(sorted(m.heap[1])), tuple(sorted(m.flag[0])), tuple(sorted(m.flag[1])))


def _tier(t: TierState, g: _Renamer, c: _Renamer) -> tuple[str, int, int]:
    if isinstance(t, OnGpu):
        return ("g", g(t.gpu), -1)
    if isinstance(t, OnCpu):
        return ("c", -1, c(t.cpu))
    if isinstance(t, SwappingOut):
        return ("o", g(t.gpu), c(t.cpu))
    return ("i", g(t.gpu), c(t.cpu))


def _transfer(t: Transfer, g: _Renamer, c: _Renamer) -> tuple[object, ...]:
    if isinstance(t, SwapOut):
        return ("o", tuple((h, g(a), c(b)) for h, a, b in t.items))
    if isinstance(t, SwapIn):
        return ("i", t.request, tuple((h, c(a), g(b)) for h, a, b in t.items))
    if isinstance(t, StorageWrite):
        return ("w", tuple((h, g(a)) for h, a in t.items), tuple(g(a) for a in t.adopted))
    assert isinstance(t, Prefetch)
    return ("p", t.request, tuple((h, g(a)) for h, a in t.items))


def relabel(m: MState) -> MState:
    """The representative state of m's class: blocks renamed as `canonical` names them,
    transfers renumbered densely. Exploring representatives keeps states finite."""
    s = m.cache
    g, c = _Renamer(), _Renamer()
    for _, n in sorted(s.nodes.items()):  # the same traversal order as `canonical`
        _tier(n.tier, g, c)
    for _, held in sorted(s.requests.items()):
        for private in held.private:
            g(private)
    for t in sorted(s.transfers):
        _transfer(s.transfers[t], g, c)
    for free in range(s.gpu_size):
        g(free)
    for free in range(s.cpu_size):
        c(free)
    tids = {t: TransferId(i) for i, t in enumerate(sorted(s.transfers))}
    gb: Callable[[GpuBlock], GpuBlock] = lambda b: GpuBlock(g.names[b])  # noqa: E731
    cb: Callable[[CpuBlock], CpuBlock] = lambda b: CpuBlock(c.names[b])  # noqa: E731
    nodes = {h: Node(n.parent, _retier(n.tier, gb, cb), n.refcount) for h, n in s.nodes.items()}
    reqs = {r: Holding(held.path, tuple(map(gb, held.private))) for r, held in s.requests.items()}
    trs = {tids[t]: _retransfer(tr, gb, cb) for t, tr in s.transfers.items()}
    cache = replace(
        s,
        gpu_free=tuple(sorted(map(gb, s.gpu_free))),
        cpu_free=tuple(sorted(map(cb, s.cpu_free))),
        nodes=nodes,
        requests=reqs,
        transfers=trs,
        gpu_pins={gb(b): k for b, k in s.gpu_pins.items()},
        cpu_pins={cb(b): k for b, k in s.cpu_pins.items()},
        next_transfer=len(trs),
    )
    return replace(m, cache=cache)


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

    @property
    def passed(self) -> bool:
        return not self.violation and self.complete

    @property
    def rate(self) -> float:
        return self.states / self.seconds if self.seconds else 0.0


def explore(scope: Scope, mutation: str = "", max_states: int = 2_000_000,
            progress: Callable[[int, int], None] | None = None) -> Report:
    """Breadth-first search of every reachable state of the scope; stops at the first
    violation (whose trace is then a shortest one)."""
    model = Model(scope, MUTATIONS[mutation] if mutation else Mutation())
    start = time.perf_counter()
    first = relabel(model.initial())
    parents: dict[bytes, tuple[bytes | None, str]] = {digest(first): (None, "init")}
    queue: deque[MState] = deque([first])
    drains: dict[bytes, int] = {}
    transitions = 0
    longest = 0

    def fail(key: bytes, found: list[Violation]) -> Report:
        return Report(scope, mutation, len(parents), transitions, time.perf_counter() - start, longest, found,
                      _trace(parents, key), True)

    while queue:
        m = queue.popleft()
        key = digest(m)
        found = model.violations(m)
        if found:
            return fail(key, found)
        drained = _drain(model, m, drains, bound=4 * (scope.gpu_blocks + scope.cpu_blocks + scope.requests) + 8)
        if drained < 0:
            return fail(key, [Violation("LIVE-DRAIN", "the drain from this state does not free every block")])
        longest = max(longest, drained)
        for label, nxt in model.successors(m):
            transitions += 1
            exit_found = model.exit_violations(label, m, nxt)
            if exit_found:
                parents.setdefault(digest(nxt), (key, label))
                return fail(digest(nxt), exit_found)
            k = digest(nxt)  # label-invariant: relabel only the states kept
            if k not in parents:
                parents[k] = (key, label)
                queue.append(relabel(nxt))
        if progress is not None and len(parents) % 5000 < 40:
            progress(len(parents), len(queue))
        if len(parents) > max_states:
            return Report(scope, mutation, len(parents), transitions, time.perf_counter() - start, longest, [], [], False)
    return Report(scope, mutation, len(parents), transitions, time.perf_counter() - start, longest, [], [], True)


def _drain(model: Model, m: MState, memo: dict[bytes, int], bound: int) -> int:
    """Steps the drain takes from m to all-free, or -1 if it gets stuck or exceeds `bound`."""
    path: list[bytes] = []
    cur: MState | None = m
    result = -1
    while cur is not None:
        key = digest(cur)
        if key in memo:
            result = memo[key] if memo[key] < 0 else memo[key] + len(path)
            break
        path.append(key)
        if len(path) > bound:
            break
        nxt = model.drain_step(cur)
        if nxt is None:
            s = cur.cache
            free = len(s.gpu_free) == s.gpu_size and len(s.cpu_free) == s.cpu_size and not s.transfers
            result = len(path) - 1 if free else -1
            break
        cur = nxt
    for i, k in enumerate(path):
        memo[k] = result - i if result >= 0 else -1
    return result


def _trace(parents: dict[bytes, tuple[bytes | None, str]], key: bytes) -> list[str]:
    out: list[str] = []
    cur: bytes | None = key
    while cur is not None:
        prev, label = parents[cur]
        if prev is not None:
            out.append(label)
        cur = prev
    return out[::-1]
