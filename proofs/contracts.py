"""Contracts on the block lifecycle's pure kernels, for CrossHair to search.

Contract style: plain `assert` statements, checked with
`crosshair check --analysis_kind asserts`. A contracted function begins with
asserts (its preconditions); any assert that fails after them is a counterexample.
Chosen over PEP 316 docstrings (icontract and deal are not installed) because the
conditions stay ordinary Python: `mypy --strict` checks them, they run on every
concrete call (tests/test_contracts.py executes them on real cases), they can call
shared helpers (a FastDeploy-bug variant reuses its correct twin's postcondition), and a
failing postcondition names its property ID in the message CrossHair prints. The
cost: `python -O` strips asserts, so never run these checks with -O.

CrossHair runs C code such as heapq concretely and stalls on unbounded recursion
over symbolic trees, so spec/ and kvcache/ are not contracted directly. Each
`*_kernel` function (and path_to) restates the logic of one function there, named
in its docstring, over plain lists of small ints with loops bounded by the input
lengths. tests/test_contracts.py compares each kernel with the real code on
concrete cases so that it cannot drift silently.

CrossHair never proves: a pass means it found no counterexample within its
per-condition timeout, over inputs the preconditions keep small (MAX_BLOCKS,
HEAP_NODES). Small matters: with 3 heap nodes instead of 2, CrossHair missed a
planted LRU-order bug for 40 s; with 2 it finds it in about 5 s. For the same
reason exit_request fixes the layout of the block ids (ids are interchangeable)
and loops over the storage outcomes concretely instead of searching for them.

GPU blocks are the indexes of an owner map, a list of owner codes (below).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

MAX_BLOCKS = 4  # blocks (and list lengths) the preconditions admit
HEAP_NODES = 2  # nodes of a tier, and entries of its heap, the heap contracts admit

# Who owns a GPU block (spec.types.Owner, narrowed to what an exit can change).
FREE, NODE, REQUEST, WRITE, OTHER = 0, 1, 2, 3, 4
# REQUEST: the private tail of the exiting request. WRITE: adopted by the storage
# write this exit starts. OTHER: another request's tail, or another transfer's block.
OWNER_NAMES = ("free", "node", "request", "write", "other")

# How the storage write of an exit ends (spec.types.Outcome, plus RAISE: the call raises).
OK, ERROR, PARTIAL, TIMEOUT, RAISE = 0, 1, 2, 3, 4
OUTCOME_NAMES = ("ok", "error", "partial", "timeout", "raise")

Heap = list[tuple[int, int]]  # LRU heap entries (stamp, node), see below


def _count(xs: list[int], x: int) -> int:
    n = 0
    for y in xs:
        if y == x:
            n += 1
    return n


def _distinct(xs: list[int]) -> bool:
    for i in range(len(xs)):
        for j in range(i):
            if xs[i] == xs[j]:
                return False
    return True


def _in_range(xs: list[int], size: int) -> bool:
    return all(0 <= x < size for x in xs)


# --- allocator: split and merge --------------------------------------------------------


def alloc_kernel(free: list[int], n: int) -> tuple[list[int], list[int]]:
    """Mirrors kvcache.allocator.BlockAllocator.allocate: pop n blocks off the top of
    the free stack; a request it cannot meet (OutOfBlocks there) takes nothing."""
    rest = list(free)
    if n < 0 or n > len(rest):
        return rest, []
    taken = [rest.pop() for _ in range(n)]
    return rest, taken


def free_kernel(free: list[int], size: int, batch: list[int]) -> tuple[list[int], bool]:
    """Mirrors kvcache.allocator.BlockAllocator.free: check the whole batch against the
    free bitmap and a seen set before pushing any of it; a bad batch (BlockOutOfRange
    or DoubleFree there) frees nothing."""
    is_free = [False] * size
    for b in free:
        is_free[b] = True
    seen = [False] * size
    for b in batch:
        if not 0 <= b < size or is_free[b] or seen[b]:
            return list(free), False
        seen[b] = True
    return free + batch, True


def allocate(free: list[int], size: int, n: int) -> tuple[list[int], list[int]]:
    """Lemma for INV-CONSERVE: each block ends up in exactly one of rest, taken and the blocks
    in use before; taken holds n distinct blocks, or nothing when n cannot be met."""
    assert 0 <= size <= MAX_BLOCKS and len(free) <= size
    assert _distinct(free) and _in_range(free, size)
    rest, taken = alloc_kernel(free, n)
    if 0 <= n <= len(free):
        assert len(taken) == n, f"INV-CONSERVE: asked for {n} blocks, took {taken}"
    else:
        assert rest == free and not taken, "bad input: an unmet allocation changed the free list"
    for b in range(size):
        in_use_before = 0 if b in free else 1
        owners = _count(rest, b) + _count(taken, b) + in_use_before
        assert owners == 1, f"INV-CONSERVE: block {b} has {owners} owners"
    assert len(rest) + len(taken) + (size - len(free)) == size, "INV-CONSERVE: |free| + |in use| != size"
    return rest, taken


def free_batch(free: list[int], size: int, batch: list[int]) -> tuple[list[int], bool]:
    """Lemma for INV-CONSERVE, INV-TIER: a batch of distinct in-range blocks, none free, joins the
    free list, which keeps no duplicates; any other batch changes nothing."""
    assert 0 <= size <= MAX_BLOCKS and len(free) <= size and len(batch) <= MAX_BLOCKS
    assert _distinct(free) and _in_range(free, size)
    out, ok = free_kernel(free, size, batch)
    valid = all(0 <= b < size and b not in free and _count(batch, b) == 1 for b in batch)
    assert ok == valid, f"bad input: batch {batch} accepted={ok}, valid={valid}"
    if ok:
        assert out == free + batch, "INV-CONSERVE: the free list is not the old one plus the batch"
        assert _distinct(out) and _in_range(out, size), f"INV-CONSERVE: free list {out} repeats or leaves the tier"
    else:
        assert out == free, "bad input: a rejected batch changed the free list"
    return out, ok


# --- refcounts along a request's path --------------------------------------------------
# Nodes are 0..len(parent)-1 and parent[i] < i (-1: a child of the root), so every walk
# up the tree ends within len(parent) steps. A request holds the root-first path that
# ends at its leaf (-1: an empty path); holders lists the leaves of the live requests.


def path_to(parent: list[int], leaf: int) -> list[int]:
    """A request's Holding.path in spec.state: the root-first chain ending at `leaf`."""
    path: list[int] = []
    node = leaf
    for _ in range(len(parent)):
        if node < 0:
            break
        path.insert(0, node)
        node = parent[node]
    return path


def refs_kernel(ref: list[int], path: list[int], by: int) -> list[int]:
    """Mirrors spec.actions._adjust_ref (and CacheManager._move_refs, node by node)."""
    out = list(ref)
    for n in path:
        out[n] += by
    return out


def _holds(parent: list[int], leaf: int, n: int) -> bool:
    """n is on the path that ends at leaf."""
    node = leaf
    for _ in range(len(parent)):
        if node == n:
            return True
        if node < 0:
            return False
        node = parent[node]
    return False


def refcounts(parent: list[int], holders: list[int]) -> list[int]:
    """INV-REFCOUNT's right-hand side: how many live requests' paths hold each node."""
    return [sum(1 for leaf in holders if _holds(parent, leaf, n)) for n in range(len(parent))]


def _refs_ok(parent: list[int], holders: list[int]) -> bool:
    n = len(parent)
    return all(-1 <= parent[i] < i for i in range(n)) and all(-1 <= leaf < n for leaf in holders)


def _check_refs(parent: list[int], ref: list[int], holders: list[int]) -> None:
    assert ref == refcounts(parent, holders), f"INV-REFCOUNT: refcounts {ref} != holders {holders}"
    for i in range(len(parent)):
        assert ref[i] >= 0, f"INV-REFCOUNT: node {i} refcount {ref[i]} < 0"
        p = parent[i]
        assert p < 0 or ref[i] <= ref[p], f"INV-REFCOUNT: node {i} refcount {ref[i]} > parent's {ref[p]}"


def take_refs(parent: list[int], ref: list[int], holders: list[int], leaf: int) -> list[int]:
    """Lemma for INV-REFCOUNT: a request matching the path to `leaf` takes one reference on each
    node of it; refcounts then count the holders again, child <= parent."""
    assert len(parent) <= MAX_BLOCKS and len(ref) == len(parent) and len(holders) <= 3
    assert _refs_ok(parent, holders) and -1 <= leaf < len(parent)
    assert ref == refcounts(parent, holders)
    out = refs_kernel(ref, path_to(parent, leaf), +1)
    _check_refs(parent, out, holders + [leaf])
    return out


def drop_refs(parent: list[int], ref: list[int], holders: list[int], j: int) -> list[int]:
    """Lemma for INV-REFCOUNT: live request j exits and drops one reference on each node of its
    path; dropping only what was taken, no refcount goes negative, child <= parent."""
    assert len(parent) <= MAX_BLOCKS and len(ref) == len(parent) and len(holders) <= 3
    assert _refs_ok(parent, holders) and 0 <= j < len(holders)
    assert ref == refcounts(parent, holders)
    out = refs_kernel(ref, path_to(parent, holders[j]), -1)
    _check_refs(parent, out, holders[:j] + holders[j + 1 :])
    return out


# --- the LRU leaf heap with lazy deletion -----------------------------------------------
# An entry is (stamp, node); a push appends, so an entry's position is its sequence
# number and the least entry is the smallest (stamp, position). alive / evictable /
# last / in_heap describe nodes 0..N-1 of one tier (kvcache.tree.Node's fields).


def _least(heap: Heap) -> int:
    best = 0
    for i in range(1, len(heap)):
        if heap[i][0] < heap[best][0]:
            best = i
    return best


def offer_kernel(heap: Heap, in_heap: list[bool], node: int, stamp: int) -> tuple[Heap, list[bool]]:
    """Mirrors kvcache.lru.LeafHeap.offer: push an entry unless the node has one."""
    if in_heap[node]:
        return list(heap), list(in_heap)
    flags = list(in_heap)
    flags[node] = True
    return heap + [(stamp, node)], flags


def pop_kernel(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int]
) -> tuple[Heap, list[bool], int]:
    """Mirrors kvcache.lru.LeafHeap.pop_evictable: the least recently used evictable
    node (-1: none). A dead node's entry is skipped; a stale entry (node not evictable)
    is dropped and the node's in_heap flag cleared, so its next offer pushes it again;
    an entry older than the node's last access is pushed again at its true age. Each
    entry is popped at most twice (a re-pushed one is current), hence the bound."""
    entries, flags = list(heap), list(in_heap)
    for _ in range(2 * len(heap)):
        if not entries:
            break
        stamp, n = entries.pop(_least(entries))
        if not alive[n]:
            continue
        if not evictable[n]:
            flags[n] = False  # LeafHeap._drop_stale
            continue
        if last[n] != stamp:
            entries.append((last[n], n))
            continue
        flags[n] = False
        return entries, flags, n
    return entries, flags, -1


def pop_kernel_heap_drop(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int]
) -> tuple[Heap, list[bool], int]:
    """FastDeploy's dropped heap node (oracle.mutants.ForgetfulHeap): a stale entry is dropped but the node
    keeps its in_heap flag, so no later offer makes it findable again."""
    entries, flags = list(heap), list(in_heap)
    for _ in range(2 * len(heap)):
        if not entries:
            break
        stamp, n = entries.pop(_least(entries))
        if not alive[n] or not evictable[n]:
            continue
        if last[n] != stamp:
            entries.append((last[n], n))
            continue
        flags[n] = False
        return entries, flags, n
    return entries, flags, -1


def heap_violation(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int], exempt: int
) -> str:
    """The first broken clause of the heap's invariant, or "". Entries name nodes of the
    tier, stamped no later than the node's last access, and every live node's in_heap
    flag says exactly whether it has an entry, of which it has at most one
    (INV-HEAP-SOUND); an evictable node other than `exempt` has one (INV-HEAP-COMPLETE)."""
    n_nodes = len(alive)
    for stamp, n in heap:
        if not 0 <= n < n_nodes:
            return f"INV-HEAP-SOUND: entry names node {n}, not of this tier"
        if alive[n] and stamp > last[n]:
            return f"INV-HEAP-SOUND: node {n}'s entry is stamped {stamp}, after its last access {last[n]}"
    for n in range(n_nodes):
        if not alive[n]:
            continue
        k = sum(1 for _, m in heap if m == n)
        if k > 1 or in_heap[n] != (k == 1):
            return f"INV-HEAP-SOUND: node {n} has in_heap={in_heap[n]} and {k} entries"
        if evictable[n] and k == 0 and n != exempt:
            return f"INV-HEAP-COMPLETE: node {n} is evictable but no entry finds it"
    return ""


def _heap_shape(heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int]) -> bool:
    n = len(alive)
    return len(heap) <= HEAP_NODES and n <= HEAP_NODES and len(in_heap) == len(evictable) == len(last) == n


def _dead_not_evictable(alive: list[bool], evictable: list[bool]) -> bool:
    return all(alive[n] or not evictable[n] for n in range(len(alive)))


def heap_offer(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int], node: int
) -> tuple[Heap, list[bool]]:
    """Lemma for INV-HEAP-COMPLETE: offering a node that just became evictable (CacheManager._settle)
    makes it findable, whether or not a popped stale entry once cleared its flag."""
    assert _heap_shape(heap, in_heap, alive, evictable, last) and 0 <= node < len(alive)
    assert alive[node] and evictable[node] and _dead_not_evictable(alive, evictable)
    assert not heap_violation(heap, in_heap, alive, evictable, last, exempt=node)
    out, flags = offer_kernel(heap, in_heap, node, last[node])
    v = heap_violation(out, flags, alive, evictable, last, exempt=-1)
    assert not v, v
    return out, flags


def _check_pop(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int],
    popped: tuple[Heap, list[bool], int],
) -> None:
    out, flags, found = popped
    v = heap_violation(out, flags, alive, evictable, last, exempt=found)
    assert not v, v
    if found < 0:
        evictable_left = any(alive[n] and evictable[n] for n in range(len(alive)))
        assert not evictable_left, "LIVE-EVICT: an evictable node was not found"
        return
    assert alive[found] and evictable[found], f"INV-HEAP-SOUND: popped node {found} is not evictable"
    assert not flags[found] and all(m != found for _, m in out), f"popped node {found} is still in the heap"
    for n in range(len(alive)):
        if alive[n] and evictable[n]:
            assert last[found] <= last[n], f"LRU order: popped node {found} was used after node {n}"


def heap_pop(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int]
) -> tuple[Heap, list[bool], int]:
    """Lemma for INV-HEAP-SOUND, INV-HEAP-COMPLETE, LIVE-EVICT: pop returns the least recently
    used evictable node when there is one, and every other evictable node stays
    findable; a stale entry's node is left with in_heap cleared, to be offered again."""
    assert _heap_shape(heap, in_heap, alive, evictable, last) and _dead_not_evictable(alive, evictable)
    assert not heap_violation(heap, in_heap, alive, evictable, last, exempt=-1)
    popped = pop_kernel(heap, in_heap, alive, evictable, last)
    _check_pop(heap, in_heap, alive, evictable, last, popped)
    return popped


def heap_pop_heap_drop(
    heap: Heap, in_heap: list[bool], alive: list[bool], evictable: list[bool], last: list[int]
) -> tuple[Heap, list[bool], int]:
    """heap_pop's contract over the heap-drop pop (FastDeploy's dropped heap node): CrossHair must find it broken."""
    assert _heap_shape(heap, in_heap, alive, evictable, last) and _dead_not_evictable(alive, evictable)
    assert not heap_violation(heap, in_heap, alive, evictable, last, exempt=-1)
    popped = pop_kernel_heap_drop(heap, in_heap, alive, evictable, last)
    _check_pop(heap, in_heap, alive, evictable, last, popped)
    return popped


# --- release on each write outcome: the exit path --------------------------------------


class ExitResult(NamedTuple):
    owner_step: list[int]  # at the end of the exit step (finish, abort or preempt)
    pins_step: list[int]
    owner_end: list[int]  # once the write it started has ended (at once, late, or by timeout)
    pins_end: list[int]
    stored: int  # how many written blocks storage confirmed


ExitKernel = Callable[[list[int], list[int], list[int], list[int], int, int, bool], ExitResult]


def _stored(outcome: int, written: int, done: int) -> int:
    """spec.types.succeeded; a raise is an error answer."""
    return written if outcome == OK else done if outcome == PARTIAL else 0


def _pending(outcome: int, late: bool) -> bool:
    """The write is still in flight at the end of the exit step."""
    return outcome == TIMEOUT or (late and outcome != RAISE)


def _end_write(
    owner: list[int], pins: list[int], written: list[int], adopted: list[int]
) -> tuple[list[int], list[int]]:
    """Mirrors CacheManager._finish_write / spec.actions.complete of a StorageWrite:
    whatever the outcome, unpin what the write read and free what it adopted."""
    own, pin = list(owner), list(pins)
    for g in written:
        pin[g] -= 1
    for g in adopted:
        own[g] = FREE
    return own, pin


def exit_kernel(
    owner: list[int], pins: list[int], private: list[int], written: list[int], outcome: int, done: int, late: bool
) -> ExitResult:
    """Mirrors scheduler.resource_manager.ResourceManager._release with
    CacheManager.release (spec.actions.release), then the write's completion: release
    first (the write pins its sources; a pinned private block passes to the write, the
    others are freed; path refcounts drop, see drop_refs), then start the write, where a
    raise is an error answer delivered at once. A timeout, or a late answer, ends it
    after the step. The path's blocks stay with their nodes throughout."""
    own, pin = list(owner), list(pins)
    for g in written:
        pin[g] += 1
    adopted: list[int] = []
    for g in private:
        if pin[g]:
            own[g] = WRITE
            adopted.append(g)
        else:
            own[g] = FREE
    end_own, end_pin = _end_write(own, pin, written, adopted)
    stored = _stored(outcome, len(written), done)
    if _pending(outcome, late):
        return ExitResult(own, pin, end_own, end_pin, stored)
    return ExitResult(end_own, end_pin, end_own, end_pin, stored)


def exit_kernel_write_raise(
    owner: list[int], pins: list[int], private: list[int], written: list[int], outcome: int, done: int, late: bool
) -> ExitResult:
    """FastDeploy PR 7807's bug, the write that raised (oracle.mutants._WriteBeforeRelease): the write runs synchronously
    before the release, and a raise escapes it, skipping the free."""
    if written and outcome == RAISE:
        return ExitResult(list(owner), list(pins), list(owner), list(pins), 0)
    own = list(owner)
    for g in private:
        own[g] = FREE
    return ExitResult(own, list(pins), list(own), list(pins), _stored(outcome, len(written), done))


def exit_precondition(
    owner: list[int], pins: list[int], private: list[int], path: list[int], written: list[int]
) -> bool:
    """When an exit may start (spec.actions.release): the request's private tail is
    exactly the blocks it owns, unpinned; its path's blocks belong to nodes; free blocks
    are unpinned; the write reads blocks of its table; nothing is adopted yet."""
    n = len(owner)
    return (
        len(pins) == n
        and all(FREE <= o <= OTHER and o != WRITE for o in owner)
        and all(p >= 0 for p in pins)
        and all(pins[g] == 0 for g in range(n) if owner[g] == FREE)
        and _distinct(private) and _in_range(private, n)
        and all(owner[g] == REQUEST and pins[g] == 0 for g in private)
        and all(g in private for g in range(n) if owner[g] == REQUEST)
        and _distinct(path) and _in_range(path, n)
        and all(owner[g] == NODE for g in path)
        and _distinct(written)
        and all(g in private or g in path for g in written)
    )


def check_exit(
    owner: list[int], pins: list[int], private: list[int], path: list[int], written: list[int],
    outcome: int, done: int, late: bool, result: ExitResult,
) -> None:
    """The exit's postcondition. LIVE-EXIT: every private block of the request is free,
    or adopted by the write while it is still in flight, and free once it ends.
    INV-CONSERVE: no other block changes owner (the path's stay with their nodes), and
    the free blocks grow by exactly the request's private ones. INV-PIN: no free block
    is pinned. LIVE-TRANSFER: the write ends leaving no pin and nothing adopted."""
    step, end = result.owner_step, result.owner_end
    how = f"on {OUTCOME_NAMES[outcome]}{' (late)' if late else ''}"
    for g in range(len(owner)):
        if g in private:
            assert step[g] == FREE or (step[g] == WRITE and _pending(outcome, late) and g in written), (
                f"LIVE-EXIT: {how}, block {g} of the request is {OWNER_NAMES[step[g]]} after the exit step"
            )
            assert end[g] == FREE, f"LIVE-EXIT: {how}, block {g} of the request is {OWNER_NAMES[end[g]]} at the end"
        else:
            assert step[g] == owner[g] and end[g] == owner[g], (
                f"INV-CONSERVE: {how}, block {g}, not the request's, changed owner from {OWNER_NAMES[owner[g]]}"
            )
        assert not (step[g] == FREE and result.pins_step[g] > 0), f"INV-PIN: {how}, block {g} is free while pinned"
    assert result.pins_end == pins, f"LIVE-TRANSFER: {how}, pins {result.pins_end} after the write, {pins} before"
    assert _count(end, FREE) == _count(owner, FREE) + len(private), f"INV-CONSERVE: {how}, blocks went missing"
    assert result.stored == _stored(outcome, len(written), done), f"{how}: storage confirmed {result.stored} blocks"


def _every_outcome(
    kernel: ExitKernel, n_path: int, n_private: int, others: list[int], pins: list[int], written: list[bool]
) -> None:
    """Lay the blocks out (path, then private, then the others) and check the exit on
    every outcome the storage write can have, at once or late."""
    owner = [NODE] * n_path + [REQUEST] * n_private + others
    path = list(range(n_path))
    private = list(range(n_path, n_path + n_private))
    table = [g for g in range(n_path + n_private) if written[g]]
    for outcome in (OK, ERROR, PARTIAL, TIMEOUT, RAISE):
        for done in range(len(table) + 1) if outcome == PARTIAL else [0]:
            for late in (False, True):
                result = kernel(owner, pins, private, table, outcome, done, late)
                check_exit(owner, pins, private, path, table, outcome, done, late, result)


def exit_request(n_path: int, n_private: int, others: list[int], pins: list[int], written: list[bool]) -> None:
    """Lemma for LIVE-EXIT, INV-CONSERVE, INV-PIN, LIVE-TRANSFER (see check_exit): after finish,
    abort or preempt, whatever the storage write does. The request's table is n_path
    node blocks then n_private private ones; `others` are the owners (free, node or
    other) of the remaining blocks; `written` says which blocks of the table the write
    reads (none for an exit whose write policy writes nothing, as abort). Block ids are
    interchangeable (the kernel only indexes and compares them), so this one layout
    stands for every other; it keeps CrossHair's search small. The outcomes are looped
    over concretely: every one of them is checked on every path CrossHair explores."""
    assert 0 <= n_path and 0 <= n_private and n_path + n_private + len(others) <= MAX_BLOCKS
    assert len(pins) == n_path + n_private + len(others) and len(written) == n_path + n_private
    assert all(o in (FREE, NODE, OTHER) for o in others) and all(p >= 0 for p in pins)
    assert all(pins[g] == 0 for g in range(n_path, n_path + n_private))
    assert all(pins[n_path + n_private + i] == 0 for i in range(len(others)) if others[i] == FREE)
    _every_outcome(exit_kernel, n_path, n_private, others, pins, written)


def exit_request_write_raise(
    n_path: int, n_private: int, others: list[int], pins: list[int], written: list[bool]
) -> None:
    """exit_request's contract over the write-raise exit (FastDeploy PR 7807): CrossHair must find it broken."""
    assert 0 <= n_path and 0 <= n_private and n_path + n_private + len(others) <= MAX_BLOCKS
    assert len(pins) == n_path + n_private + len(others) and len(written) == n_path + n_private
    assert all(o in (FREE, NODE, OTHER) for o in others) and all(p >= 0 for p in pins)
    assert all(pins[g] == 0 for g in range(n_path, n_path + n_private))
    assert all(pins[n_path + n_private + i] == 0 for i in range(len(others)) if others[i] == FREE)
    _every_outcome(exit_kernel_write_raise, n_path, n_private, others, pins, written)
