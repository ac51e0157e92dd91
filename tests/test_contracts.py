"""The CrossHair contracts of proofs/: the default targets find no counterexample, the
FastDeploy-bug variants are found, and every kernel agrees with the code it mirrors.

The allocator and heap kernels mirror the reference's choices exactly (its LIFO free
stack, its LRU order with ties broken by push order), choices spec/ leaves open: the
tests that compare them step by step are named after the choice. Next to each, a test
checks the real code against the contracts' properties on whatever it chooses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvoracle.kvcache.abstraction import abstract
from kvoracle.kvcache.allocator import BlockAllocator
from kvoracle.kvcache.errors import BlockOutOfRange, DoubleFree, KVCacheError, OutOfBlocks
from kvoracle.kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, NoFaults, ScriptedFaults
from kvoracle.kvcache.lru import LeafHeap
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.kvcache.tree import GPU, Node as TreeNode
from kvoracle.proofs import contracts as c
from kvoracle.proofs import crosshair_check as cc
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import actions
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import owners
from kvoracle.spec.view import FREE, of_cache, request_name, transfer_name
from kvoracle.spec.state import CacheState, initial
from kvoracle.spec.types import (
    BlockHash,
    Error,
    GpuBlock,
    Ok,
    OnGpu,
    Outcome,
    Partial,
    RequestId,
    Timeout,
    TransferId,
    gpu_block_of,
)

G = GpuBlock
R0, R1, R2 = RequestId(0), RequestId(1), RequestId(2)
HS = block_hashes([1, 2, 3, 4, 5, 6], 2)  # three chained full blocks


# --- CrossHair ---------------------------------------------------------------------------
# CrossHair finds FastDeploy's bugs in about 1 s, but needed about 5 s for deeper planted bugs
# (an exit that keeps two adopted blocks on error; a pop that ignores re-use since the
# push): the checks here give each condition 10 s, and so does `kvoracle prove`.
SEARCH_S = 10.0


def _table(results: Sequence[cc.ContractResult]) -> str:
    return "\n".join(f"{r.function}: {r.verdict} in {r.seconds:.1f} s {r.property_ids}\n  {r.detail}"
                     for r in results)


def test_default_targets_find_no_counterexample() -> None:
    # Each target gets 40 s of wall clock for 10 s of CPU per condition: room for a loaded
    # machine (an unloaded run takes about 20 s a target).
    results = cc.check(per_condition_timeout=SEARCH_S, total_timeout=300.0)
    print(_table(results))
    assert [r.function for r in results] == list(cc.OBLIGATIONS)
    assert all(r.verdict == cc.NONE_FOUND for r in results), _table(results)
    assert all(r.property_ids for r in results)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("exit_request_write_raise", "LIVE-EXIT: on raise, block"),
        ("heap_pop_heap_drop", "INV-HEAP-SOUND"),
    ],
)
def test_crosshair_finds_the_fastdeploy_bugs(target: str, message: str) -> None:
    (result,) = cc.check([target], per_condition_timeout=SEARCH_S, total_timeout=60.0)
    print(_table([result]))
    assert result.verdict == cc.COUNTEREXAMPLE, _table([result])
    assert message in result.detail and f"when calling {target}(" in result.detail
    assert result.property_ids == cc.SEED_BUGS[target]


def test_write_raise_counterexample_replays() -> None:
    """The counterexample CrossHair prints, as a plain regression test: one private
    block, written, and the write raises; the correct exit frees it."""
    with pytest.raises(AssertionError, match="LIVE-EXIT: on raise, block 0 of the request is request"):
        c.exit_request_write_raise(0, 1, [], [0], [True])
    c.exit_request(0, 1, [], [0], [True])
    got = c.exit_kernel([c.REQUEST], [0], [0], [0], c.RAISE, 0, False)
    assert got.owner_step == got.owner_end == [c.FREE]


def test_parse_verdicts() -> None:
    ok = "/x/contracts.py:9: info: Not confirmed.\n"
    assert cc.parse(ok, 0, 3.0)[0] == cc.NONE_FOUND
    bad = "/x/contracts.py:9: error: AssertionError: LIVE-EXIT when calling f(1)\n"
    assert cc.parse(bad, 1, 3.0) == (cc.COUNTEREXAMPLE, "line 9: AssertionError: LIVE-EXIT when calling f(1)")
    nothing = "WARNING: Targets found, but contain no checkable functions.\n"
    assert cc.parse(nothing, 0, 3.0)[0] == cc.ERROR  # nothing analysed is no pass
    assert cc.parse("Traceback ...\n", 2, 3.0)[0] == cc.ERROR


def test_unknown_target_is_an_error() -> None:
    (result,) = cc.check(["no_such_function"], per_condition_timeout=1.0, total_timeout=30.0)
    assert result.verdict == cc.ERROR and result.property_ids == ()


def test_total_timeout_leaves_targets_unrun() -> None:
    results = cc.check(["allocate", "free_batch"], per_condition_timeout=1.0, total_timeout=0.5)
    assert [r.verdict for r in results] == [cc.ERROR, cc.ERROR]
    assert "not run" in results[0].detail


# --- the allocator kernels agree with BlockAllocator ---------------------------------------

alloc_ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(-1, 5), st.just([0])),
        st.tuples(st.just("free"), st.just(0), st.lists(st.integers(-1, 4), max_size=4)),
    ),
    max_size=12,
)


@given(size=st.integers(0, c.MAX_BLOCKS), ops=alloc_ops)
@example(size=2, ops=[("alloc", -1, [0]), ("alloc", 2, [0]), ("free", 0, [1, 1])])  # n < 0; a block twice in a batch
@example(size=4, ops=[("alloc", 2, [0]), ("free", 0, [0, 4]), ("free", 0, [1, 0, 0])])  # bad last blocks free nothing
@example(size=4, ops=[("alloc", 3, [0]), ("free", 0, [2, 0]), ("alloc", 2, [0]), ("free", 0, [1]), ("alloc", 3, [0])])
def test_allocator_meets_the_allocator_contracts(size: int, ops: list[tuple[str, int, list[int]]]) -> None:
    """BlockAllocator against what the allocate and free_batch contracts promise, on
    whichever free blocks it takes (spec/ leaves that open): an allocation takes n distinct
    free blocks, or raises OutOfBlocks exactly when the contract says it cannot be met and
    takes nothing; a free accepts exactly the batches the free_batch kernel accepts (which
    depends on the free set, not its order), the free set becomes the old one plus the
    batch, and a rejected batch changes nothing. The free bitmap agrees with the free list
    throughout. The contracts run on every case too."""
    real = BlockAllocator("GPU", size, GpuBlock)
    for op, n, batch in ops:
        free: list[int] = list(real.free_blocks())
        if op == "alloc":
            _, kernel_took = c.allocate(free, size, n)  # the contract, on this state
            meetable = 0 <= n <= len(free)
            try:
                taken = real.allocate(n)
            except OutOfBlocks:
                assert not meetable and kernel_took == []
                assert real.free_blocks() == free
            else:
                assert meetable and len(taken) == len(kernel_took) == n
                assert len(set(taken)) == n and set(taken) <= set(free), f"took {taken} from free {free}"
                assert sorted(real.free_blocks()) == sorted(set(free) - set(taken))
        else:
            out, accepted = c.free_batch(free, size, batch)  # the contract, on this state
            try:
                real.free([GpuBlock(b) for b in batch])
            except (DoubleFree, BlockOutOfRange):
                assert not accepted and real.free_blocks() == free
            else:
                assert accepted and sorted(real.free_blocks()) == sorted(out)
        now = real.free_blocks()
        assert [real.is_free(b) for b in range(-1, size + 1)] == [b in now for b in range(-1, size + 1)]


@given(size=st.integers(0, c.MAX_BLOCKS), ops=alloc_ops)
@example(size=4, ops=[("alloc", 3, [0]), ("free", 0, [2, 0]), ("alloc", 2, [0])])  # LIFO, FIFO, lowest-first differ
def test_allocator_kernels_mirror_the_lifo_free_stack(size: int, ops: list[tuple[str, int, list[int]]]) -> None:
    """alloc_kernel and free_kernel mirror BlockAllocator step by step, down to the order of
    its free stack: the block freed last is taken first. That is the reference's choice,
    which spec/ leaves open (its actions take the blocks as arguments); a change of the
    reuse order must change the kernels with it."""
    real = BlockAllocator("GPU", size, GpuBlock)
    free = list(reversed(range(size)))
    for op, n, batch in ops:
        if op == "alloc":
            free, taken = c.allocate(free, size, n)  # the contract runs too
            try:
                assert real.allocate(n) == taken
            except KVCacheError:
                assert taken == [] and n != 0
        else:
            free, ok = c.free_batch(free, size, batch)
            try:
                real.free([GpuBlock(b) for b in batch])
                assert ok
            except KVCacheError:
                assert not ok
        assert real.free_blocks() == free


# --- the refcount kernels agree with spec/ and kvcache/ --------------------------------------


def _spec_refcounts() -> list[list[int]]:
    s = initial(6, 0)
    s = actions.match(s, R0, HS)
    s = actions.allocate(s, R0, [G(0), G(1), G(2)])
    seen = []
    steps: list[Callable[[CacheState], CacheState]] = [
        lambda s: actions.commit(s, R0, HS),
        lambda s: actions.match(s, R1, HS[:2]),
        lambda s: actions.match(s, R2, HS),
        lambda s: actions.release(s, R0),
        lambda s: actions.release(s, R2),
    ]
    for step in steps:
        s = step(s)
        seen.append([s.nodes[h].refcount for h in HS])
    return seen


def _kvcache_refcounts() -> list[list[int]]:
    m = CacheManager(6)
    m.match(R0, HS)
    m.allocate(R0, 3)
    seen = []
    steps: list[Callable[[], object]] = [
        lambda: m.commit(R0, HS),
        lambda: m.match(R1, HS[:2]),
        lambda: m.match(R2, HS),
        lambda: m.release(R0),
        lambda: m.release(R2),
    ]
    for step in steps:
        step()
        s = abstract(m)
        seen.append([s.nodes[h].refcount for h in HS])
    return seen


def test_refcount_kernels_agree() -> None:
    parent = [-1, 0, 1]  # HS[i] is node i
    ref, holders = [0, 0, 0], list[int]()
    want = []
    for kind, arg in (("take", 2), ("take", 1), ("take", 2), ("drop", 0), ("drop", 1)):
        if kind == "take":
            ref = c.take_refs(parent, ref, holders, arg)
            holders = holders + [arg]
        else:
            ref = c.drop_refs(parent, ref, holders, arg)
            holders = holders[:arg] + holders[arg + 1 :]
        want.append(ref)
    assert _spec_refcounts() == want
    assert _kvcache_refcounts() == want
    assert want[-1] == [1, 1, 0]


# --- the heap kernels agree with LeafHeap --------------------------------------------------

heap_ops = st.lists(
    st.tuples(st.sampled_from(["offer", "touch", "flip", "kill", "pop"]), st.integers(0, 2)), max_size=20
)


@given(ops=heap_ops)
@example(ops=[("touch", 0), ("touch", 1), ("offer", 0), ("offer", 1), ("flip", 0), ("flip", 1), ("pop", 0)])  # LRU
@example(ops=[("offer", 1), ("offer", 0), ("flip", 0), ("flip", 1), ("pop", 0), ("pop", 0)])  # a tie: push order
def test_heap_kernels_mirror_the_lru_heap_and_its_tie_break(ops: list[tuple[str, int]]) -> None:
    """offer_kernel and pop_kernel mirror LeafHeap entry by entry: least recently used first,
    ties broken by push order. That order is the reference's choice, which spec/ leaves
    open (spec.actions.evict takes the node as an argument); a change of it must change
    the kernels with it. test_leaf_heap_keeps_its_invariant_in_any_pop_order checks what
    does not depend on it."""
    nodes = [TreeNode(BlockHash(i + 1), None, OnGpu(G(i))) for i in range(3)]
    index = {id(n): i for i, n in enumerate(nodes)}
    real = LeafHeap(GPU)
    heap: c.Heap = []
    in_heap, alive, evictable, last = [False] * 3, [True] * 3, [False] * 3, [0] * 3
    clock = 0
    for op, i in ops:
        if op == "offer":
            real.offer(nodes[i])
            heap, in_heap = c.offer_kernel(heap, in_heap, i, last[i])
        elif op == "touch":
            clock += 1
            last[i] = nodes[i].last_access = clock
        elif op == "flip":
            evictable[i] = not evictable[i]
        elif op == "kill":
            alive[i] = nodes[i].alive = False
            evictable[i] = False
        else:
            got = real.pop_evictable(lambda n: evictable[index[id(n)]], [])
            heap, in_heap, found = c.pop_kernel(heap, in_heap, alive, evictable, last)
            assert (-1 if got is None else index[id(got)]) == found
        in_order = sorted(real._entries, key=lambda e: (e[0], e[1]))  # (stamp, push order)
        assert [(stamp, index[id(n)]) for stamp, _, n in in_order] == [
            heap[k] for k in sorted(range(len(heap)), key=lambda k: (heap[k][0], k))
        ]
        assert [n.in_heap[GPU] for n in nodes] == in_heap


life_ops = st.lists(st.tuples(st.sampled_from(["flip", "touch", "kill", "pop"]), st.integers(0, 2)), max_size=24)


@given(ops=life_ops)
@example(ops=[("flip", 0), ("flip", 1), ("flip", 0), ("pop", 0), ("flip", 0), ("pop", 0), ("pop", 0), ("pop", 0)])
@example(ops=[("flip", 0), ("touch", 0), ("flip", 1), ("kill", 1), ("pop", 0), ("pop", 0)])
def test_leaf_heap_keeps_its_invariant_in_any_pop_order(ops: list[tuple[str, int]]) -> None:
    """What LeafHeap owes the cache whichever evictable node it pops (spec/ leaves the order
    open), with nodes offered the moment they become evictable, as CacheManager._settle does:
    after every step the heap meets the contracts' invariant (heap_violation: INV-HEAP-SOUND,
    INV-HEAP-SOUND); a pop returns a live evictable node and keeps no entry or flag for it,
    reports as stale only live nodes that are not evictable, and returns None only when no node is
    evictable (LIVE-EVICT). A popped node is then moved off the tier (not evictable, alive)."""
    nodes = [TreeNode(BlockHash(i + 1), None, OnGpu(G(i))) for i in range(3)]
    index = {id(n): i for i, n in enumerate(nodes)}
    real = LeafHeap(GPU)
    alive, evictable = [True] * 3, [False] * 3
    clock = 0
    for op, i in ops:
        if op == "flip" and alive[i]:
            evictable[i] = not evictable[i]
            if evictable[i]:
                real.offer(nodes[i])
        elif op == "touch" and alive[i]:
            clock += 1
            nodes[i].last_access = clock
        elif op == "kill":
            alive[i] = nodes[i].alive = False
            evictable[i] = False
        elif op == "pop":
            stale: list[TreeNode] = []
            got = real.pop_evictable(lambda n: evictable[index[id(n)]], stale)
            assert all(n.alive and not evictable[index[id(n)]] for n in stale)  # a SkipStale names a live node
            if got is None:
                assert not any(evictable), "LIVE-EVICT: an evictable node was not found"
            else:
                k = index[id(got)]
                assert alive[k] and evictable[k], f"INV-HEAP-SOUND: popped node {k} is not evictable"
                assert not got.in_heap[GPU] and all(n is not got for n in real.entries())
                evictable[k] = False
        entries = [(stamp, index[id(n)]) for stamp, _, n in real._entries]
        flags = [n.in_heap[GPU] for n in nodes]
        last = [n.last_access for n in nodes]
        assert c.heap_violation(entries, flags, alive, evictable, last, exempt=-1) == ""


def test_heap_pop_drops_a_stale_entry_and_the_next_offer_finds_the_node() -> None:
    """The heap invariants on the path of FastDeploy's dropped heap node: node 0's entry is stale (it was
    shared again), pop drops it, the node becomes evictable, the offer re-adds it."""
    heap: c.Heap = [(1, 0), (2, 1)]
    alive, last = [True, True], [1, 2]
    heap, flags, found = c.heap_pop(heap, [True, True], alive, [False, True], last)
    assert found == 1 and heap == [] and flags == [False, False]
    heap, flags = c.heap_offer(heap, flags, alive, [True, False], last, 0)
    assert heap == [(1, 0)] and flags == [True, False]
    with pytest.raises(AssertionError, match="INV-HEAP-SOUND"):
        c.heap_pop_heap_drop([(1, 0)], [True], [True], [False], [1])


# --- the exit kernel agrees with spec/ and with the resource manager --------------------------


def owner_map(s: CacheState, r: RequestId, write: TransferId | None) -> list[int]:
    """The kernel's owner codes for every GPU block of s (each has exactly one owner)."""
    v = of_cache(s)
    claims = owners(v.gpu, v.owned_privately()) or {}
    codes = {FREE: c.FREE, f"request {request_name(r)}": c.REQUEST}
    if write is not None:
        codes[transfer_name(write)] = c.WRITE
    out = []
    for g in range(s.gpu_size):
        who = claims.get(g, [])
        assert len(who) == 1, f"block {g}: {who}"
        out.append(c.NODE if who[0].startswith("node ") else codes.get(who[0], c.OTHER))
    return out


def pin_list(s: CacheState) -> list[int]:
    return [s.gpu_pins.get(G(g), 0) for g in range(s.gpu_size)]


def path_blocks(s: CacheState, r: RequestId) -> list[int]:
    return [g for h in s.requests[r].path for g in [gpu_block_of(s.nodes[h].tier)] if g is not None]


def run_exit(s: CacheState, r: RequestId, written: list[int], code: int, done: int, late: bool) -> c.ExitResult:
    """The exit kernel on r's exit from s, with its contract checked on this case too."""
    owner, pins, path = owner_map(s, r, None), pin_list(s), path_blocks(s, r)
    private = [int(g) for g in s.requests[r].private]
    assert c.exit_precondition(owner, pins, private, path, written)
    got = c.exit_kernel(owner, pins, private, written, code, done, late)
    c.check_exit(owner, pins, private, path, written, code, done, late, got)
    return got


def _two_requests(other_write: bool) -> CacheState:
    """R0: path HS[0] on block 0, private blocks 1, 2. R1 shares HS[0] and holds block
    3, or (other_write) has exited with a write still reading block 0. Four blocks:
    the contracts' preconditions admit at most MAX_BLOCKS."""
    s = initial(c.MAX_BLOCKS, 0)
    s = actions.allocate(actions.match(s, R0, HS), R0, [G(0), G(1), G(2)])
    s = actions.commit(s, R0, HS[:1])
    s = actions.allocate(actions.match(s, R1, HS[:1]), R1, [G(3)])
    return actions.release(s, R1, [(HS[0], G(0))]) if other_write else s


OUTCOMES: list[tuple[int, Outcome]] = [
    (c.OK, Ok()), (c.ERROR, Error()), (c.PARTIAL, Partial(1)), (c.TIMEOUT, Timeout()), (c.RAISE, Error()),
]
@pytest.mark.parametrize("other_write", [False, True])
@pytest.mark.parametrize("n_written", [0, 1, 2, 3])
@pytest.mark.parametrize(("code", "outcome"), OUTCOMES)
@pytest.mark.parametrize("late", [False, True])
def test_exit_kernel_agrees_with_spec(
    other_write: bool, n_written: int, code: int, outcome: Outcome, late: bool
) -> None:
    s = _two_requests(other_write)
    writes = list(zip(HS, [G(0), G(1), G(2)]))[:n_written]
    done = min(1, n_written)
    if isinstance(outcome, Partial):
        outcome = Partial(done)
    wid = TransferId(s.next_transfer) if writes else None
    stepped = actions.release(s, R0, writes)  # the write starts, the request is released
    ended = actions.complete(stepped, wid, outcome) if wid is not None else stepped
    pending = code == c.TIMEOUT or (late and code != c.RAISE)
    got = run_exit(s, R0, [g for _, g in writes], code, done, late)
    seen_at_step = stepped if pending else ended
    assert got.owner_step == owner_map(seen_at_step, R0, wid)
    assert got.pins_step == pin_list(seen_at_step)
    assert got.owner_end == owner_map(ended, R0, wid)
    assert got.pins_end == pin_list(ended)
    assert got.stored == len(ended.stored) - len(s.stored)


FAULTS: list[tuple[Fault, int, int, bool]] = [  # fault, kernel outcome, done, late
    (Fault(FaultKind.OK), c.OK, 0, False),
    (Fault(FaultKind.RAISE), c.RAISE, 0, False),
    (Fault(FaultKind.ERROR), c.ERROR, 0, False),
    (Fault(FaultKind.PARTIAL, done=1), c.PARTIAL, 1, False),
    (Fault(FaultKind.HANG), c.TIMEOUT, 0, False),
    (Fault(FaultKind.LATE, delay=2), c.OK, 0, True),
    (Fault(FaultKind.TWICE, delay=1), c.OK, 0, False),
]


def _exit(rm: ResourceManager, kind: str) -> Callable[[RequestId], None]:
    if kind == "finish":
        return lambda r: rm.finish([r])
    return rm.preempt if kind == "preempt" else rm.abort


@pytest.mark.parametrize("kind", ["finish", "preempt", "abort"])
@pytest.mark.parametrize(("fault", "code", "done", "late"), FAULTS)
def test_exit_kernel_agrees_with_resource_manager(kind: str, fault: Fault, code: int, done: int, late: bool) -> None:
    """R0 and R1 run the same prompt; R0's full block became a node, so R1's stayed
    private. R1 exits; its storage write (of private blocks: adopted) meets `fault`."""
    storage = FaultyStorage(MemoryStorage(), ScriptedFaults([fault]))
    rm = ResourceManager(
        CacheManager(c.MAX_BLOCKS), storage, FaultyCopier(NoFaults()), block_size=2,
        write_policy=WritePolicy.ON_FINISH_AND_PREEMPT, timeout=3,
    )
    for r in (R0, R1):
        rm.submit(r, [1, 2, 3])
    rm.schedule()
    rm.schedule()  # commits R0's full block, not R1's (same hash), and decodes
    req, cache = rm.requests[R1], rm.cache
    written: list[int] = []
    if kind != "abort":
        hashes = rm.hashes(R1)[: req.blocks]
        written = [g for h, g in zip(hashes, cache.table(R1)) if h not in cache.stored]
    assert bool(written) == (kind != "abort")  # private blocks written: adopted by the write
    done = min(done, len(written))  # abort writes nothing, so nothing is done
    s = abstract(cache)
    wid = TransferId(cache.next_transfer) if written else None
    got = run_exit(s, R1, written, code, done, late)
    _exit(rm, kind)(R1)
    stepped = abstract(rm.cache)
    assert got.owner_step == owner_map(stepped, R1, wid)
    assert got.pins_step == pin_list(stepped)
    rm.tick(rm.timeout)  # late answers arrive, hung writes time out
    ended = abstract(rm.cache)
    assert got.owner_end == owner_map(ended, R1, wid)
    assert got.pins_end == pin_list(ended)
    assert got.stored == len(ended.stored)
