"""Unit tests of the pure model in spec/: hashing, actions, preconditions, invariants."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from kvoracle.spec import actions
from kvoracle.spec.actions import Drop, EvictCpu, PreconditionError, SwapOutTo
from kvoracle.spec.hashing import block_hash, block_hashes
from kvoracle.spec import invariants
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import (
    CacheState,
    Heap,
    Holding,
    StorageWrite,
    SwapOut,
    gpu_evictable,
    initial,
)
from kvoracle.spec.liveness import (ADMIT_GRACE, PROGRESS_GRACE, live_admit, live_progress, live_transfer, stall,
                                    standstill)
from kvoracle.spec.view import TierView, View, of_cache, true_counters, with_kept_counters
from kvoracle.spec.types import (
    BlockHash,
    CpuBlock,
    Error,
    GpuBlock,
    Ok,
    OnCpu,
    OnGpu,
    Outcome,
    Partial,
    RequestId,
    SwappingOut,
    Tier,
    Timeout,
    TransferId,
)

G, C = GpuBlock, CpuBlock
R0, R1, R2 = RequestId(0), RequestId(1), RequestId(2)
T0 = TransferId(0)
HS = block_hashes([1, 2, 3, 4, 5, 6], 2)  # three chained full blocks
OTHER = block_hashes([7, 8], 2)[0]  # a root block unrelated to HS


def on_state(predicate: Callable[[View], list[Violation]]) -> Callable[[CacheState], list[Violation]]:
    """A spec predicate evaluated on the complete view of a state."""
    return lambda s: predicate(of_cache(s))


inv_conserve, inv_refcount, inv_tree, inv_tier, inv_no_uaf, inv_pin, inv_heap_complete, inv_heap_sound, check = map(
    on_state, (invariants.inv_conserve, invariants.inv_refcount, invariants.inv_tree, invariants.inv_tier,
               invariants.inv_no_uaf, invariants.inv_pin, invariants.inv_heap_complete, invariants.inv_heap_sound,
               invariants.check))


def counted(s: CacheState, off: str = "") -> View:
    """The view with every counter an implementation keeps, `off` reported one too many."""
    return with_kept_counters(s, {k: n + (k == off) for k, n in true_counters(s).items()})


def ids(found: list[Violation]) -> set[str]:
    return {v.id for v in found}


def cached(gpu: int = 4, cpu: int = 2, n: int = 2) -> CacheState:
    """R0 computed HS[:n] into G0.., committed them and left: n GPU nodes at refcount 0."""
    s = actions.match(initial(gpu, cpu), R0, HS[:n])
    s = actions.allocate(s, R0, [G(i) for i in range(n)])
    s = actions.commit(s, R0, HS[:n])
    return actions.release(s, R0)


def busy() -> CacheState:
    """R1 holds HS[:2] and private G2; R2 left with a storage write of its private G3 in flight."""
    s = actions.match(cached(gpu=6), R1, HS[:2])
    s = actions.allocate(s, R1, [G(2)])
    s = actions.match(s, R2, [])
    s = actions.allocate(s, R2, [G(3)])
    return actions.release(s, R2, [(HS[2], G(3))])


def two_leaves() -> CacheState:
    """Two unrelated evictable root nodes: HS[0] on G0 and OTHER on G1."""
    s = initial(4, 2)
    for r, h, g in ((R0, HS[0], G(0)), (R1, OTHER, G(1))):
        s = actions.match(s, r, [])
        s = actions.allocate(s, r, [g])
        s = actions.commit(s, r, [h])
        s = actions.release(s, r)
    return s


# --- hashing ---------------------------------------------------------------------


def test_partial_trailing_block_gets_no_hash() -> None:
    assert len(block_hashes([1, 2, 3, 4, 5], 2)) == 2
    assert block_hashes([1, 2, 3, 4, 5], 2) == block_hashes([1, 2, 3, 4], 2)
    assert block_hashes([1], 2) == ()


def test_same_block_after_different_prefixes_gets_different_hashes() -> None:
    after_12 = block_hashes([1, 2, 3, 4], 2)
    after_99 = block_hashes([9, 9, 3, 4], 2)
    assert after_12[1] != after_99[1]
    assert after_12[1] == block_hash(after_12[0], [3, 4])


def test_hashes_are_the_same_in_another_process() -> None:
    code = "from kvoracle.spec.hashing import block_hashes; print(list(block_hashes([1, 2, 3, 4], 2, [5])))"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(list(block_hashes((1, 2, 3, 4), 2, (5,))))


def test_extra_keys_change_every_hash() -> None:
    plain = block_hashes([1, 2, 3, 4], 2)
    keyed = block_hashes([1, 2, 3, 4], 2, extra=[7])
    assert all(a != b for a, b in zip(plain, keyed, strict=True))
    assert keyed != block_hashes([1, 2, 3, 4], 2, extra=[8])


# --- initial state and match ---------------------------------------------------------


def test_initial_state_satisfies_every_invariant() -> None:
    s = initial(4, 2)
    assert len(s.gpu_free) == 4 and len(s.cpu_free) == 2
    assert check(s) == []


def test_match_on_empty_tree_takes_no_hits() -> None:
    s = actions.match(initial(4, 2), R0, HS)
    assert s.requests[R0] == Holding((), ())
    assert s.transfers == {} and len(s.gpu_free) == 4
    assert check(s) == []


def test_second_match_after_release_takes_gpu_hits_and_refcounts() -> None:
    s = actions.match(initial(4, 2), R0, HS[:2])
    steps: list[Callable[[CacheState], CacheState]] = [
        lambda s: actions.allocate(s, R0, [G(0), G(1)]),
        lambda s: actions.commit(s, R0, HS[:2]),
        lambda s: actions.release(s, R0),
        lambda s: actions.match(s, R1, HS[:2]),
    ]
    for step in steps:
        s = step(s)
        assert check(s) == []
    assert s.requests[R1] == Holding(HS[:2], ())
    assert [s.nodes[h].refcount for h in HS[:2]] == [1, 1]
    assert actions.table(s, R1) == (G(0), G(1))
    assert s.gpu_free == (G(2), G(3))


def test_a_match_takes_no_more_gpu_blocks_than_its_caller_allowed() -> None:
    s = replace(initial(4, 2), stored=frozenset(HS[:2]))  # both blocks in storage only: prefetch hits
    for limit in (None, 2):
        assert actions.match(s, R0, HS[:2], prefetch_dests=[G(0), G(1)], limit=limit).requests[R0].private == (G(0), G(1))
    with pytest.raises(PreconditionError, match="2 GPU blocks swapped in and prefetched for a limit of 1"):
        actions.match(s, R0, HS[:2], prefetch_dests=[G(0), G(1)], limit=1)


# --- commit ------------------------------------------------------------------------------


def test_commit_stops_at_first_hash_already_in_tree() -> None:
    s = actions.match(cached(n=1), R1, [])  # R1 matched nothing: HS[0] is cached, yet R1 recomputed it
    s = actions.allocate(s, R1, [G(1), G(2)])
    s = actions.commit(s, R1, HS[:2])
    assert s.requests[R1] == Holding((), (G(1), G(2)))
    assert set(s.nodes) == {HS[0]}
    assert check(s) == []


def test_commit_makes_nodes_in_order_chained_to_the_path() -> None:
    s = actions.match(initial(4, 2), R0, [])
    s = actions.allocate(s, R0, [G(2), G(0), G(1)])
    s = actions.commit(s, R0, HS[:2])
    assert s.requests[R0] == Holding(HS[:2], (G(1),))
    assert s.nodes[HS[0]].tier == OnGpu(G(2)) and s.nodes[HS[0]].parent is None
    assert s.nodes[HS[1]].tier == OnGpu(G(0)) and s.nodes[HS[1]].parent == HS[0]


# --- preconditions -----------------------------------------------------------------------

PRECONDITIONS: list[tuple[str, str, Callable[[], CacheState]]] = [
    ("unknown request: allocate", "allocate", lambda: actions.allocate(initial(2, 0), R0, [G(0)])),
    ("unknown request: commit", "commit", lambda: actions.commit(initial(2, 0), R0, [])),
    ("unknown request: release", "release", lambda: actions.release(initial(2, 0), R0)),
    ("hashes disagree with path", "commit", lambda: actions.commit(actions.match(cached(), R1, HS[:2]), R1, [HS[1], HS[0]])),
    ("hashes shorter than path", "commit", lambda: actions.commit(actions.match(cached(), R1, HS[:2]), R1, HS[:1])),
    ("allocate a node's block", "allocate", lambda: actions.allocate(actions.match(cached(), R1, []), R1, [G(0)])),
    ("allocate a block twice", "allocate", lambda: actions.allocate(actions.match(cached(), R1, []), R1, [G(2), G(2)])),
    ("evict a held node", "evict", lambda: actions.evict(actions.match(cached(), R1, HS[:2]), [SwapOutTo(HS[1], C(0))])),
    ("evict a node with a GPU child", "evict", lambda: actions.evict(cached(), [SwapOutTo(HS[0], C(0))])),
    ("evict-cpu a GPU node", "evict", lambda: actions.evict(cached(), [EvictCpu(HS[1])])),
    ("drop while CPU is free", "evict", lambda: actions.evict(cached(cpu=2), [Drop(HS[1])])),
    ("reset with live request", "reset", lambda: actions.reset(actions.match(initial(2, 0), R0, []))),
    ("complete unknown transfer", "complete", lambda: actions.complete(initial(2, 0), T0, Ok())),
]


@pytest.mark.parametrize(("action", "call"), [p[1:] for p in PRECONDITIONS], ids=[p[0] for p in PRECONDITIONS])
def test_precondition_violation_raises(action: str, call: Callable[[], CacheState]) -> None:
    with pytest.raises(PreconditionError) as e:
        call()
    assert e.value.action == action


def test_drop_is_allowed_once_cpu_tier_has_no_room() -> None:
    s = actions.evict(cached(cpu=0), [Drop(HS[1])])
    assert HS[1] not in s.nodes and G(1) in s.gpu_free
    assert check(s) == []


# --- eviction and completion ---------------------------------------------------------------


def swapped_out() -> CacheState:
    s = actions.evict(cached(), [SwapOutTo(HS[1], C(0))])
    assert s.nodes[HS[1]].tier == SwappingOut(G(1), C(0))
    assert s.transfers == {T0: SwapOut(((HS[1], G(1), C(0)),))} and s.gpu_pins == {G(1): 1}
    assert check(s) == []
    return s


def test_swap_out_ok_moves_node_to_cpu_and_frees_gpu_block() -> None:
    s = actions.complete(swapped_out(), T0, Ok())
    assert s.nodes[HS[1]].tier == OnCpu(C(0))
    assert G(1) in s.gpu_free and C(0) not in s.cpu_free
    assert s.gpu_pins == {} and s.transfers == {}
    assert check(s) == []


def test_swap_out_error_keeps_node_on_gpu_and_frees_cpu_block() -> None:
    s = actions.complete(swapped_out(), T0, Error())
    assert s.nodes[HS[1]].tier == OnGpu(G(1))
    assert G(1) not in s.gpu_free and C(0) in s.cpu_free
    assert s.gpu_pins == {}
    assert check(s) == []


def test_partial_swap_out_moves_only_the_leading_items() -> None:
    s = actions.evict(two_leaves(), [SwapOutTo(HS[0], C(0)), SwapOutTo(OTHER, C(1))])
    assert len(s.transfers) == 1
    s = actions.complete(s, T0, Partial(1))
    assert s.nodes[HS[0]].tier == OnCpu(C(0)) and s.nodes[OTHER].tier == OnGpu(G(1))
    assert G(0) in s.gpu_free and G(1) not in s.gpu_free
    assert C(0) not in s.cpu_free and C(1) in s.cpu_free
    assert check(s) == []


def test_partial_beyond_item_count_is_rejected() -> None:
    with pytest.raises(PreconditionError):
        actions.complete(swapped_out(), T0, Partial(2))


# --- release with a storage write ------------------------------------------------------------


def released_with_write() -> CacheState:
    """R0 committed HS[0] on G0 and holds private G1; it leaves writing both blocks."""
    s = actions.match(initial(4, 0), R0, [])
    s = actions.allocate(s, R0, [G(0), G(1)])
    s = actions.commit(s, R0, HS[:1])
    return actions.release(s, R0, [(HS[0], G(0)), (HS[1], G(1))])


def test_release_with_write_adopts_private_blocks_until_complete() -> None:
    s = released_with_write()
    assert s.transfers == {T0: StorageWrite(((HS[0], G(0)), (HS[1], G(1))), adopted=(G(1),))}
    assert G(1) not in s.gpu_free and s.gpu_pins == {G(0): 1, G(1): 1}
    assert s.requests == {} and s.nodes[HS[0]].refcount == 0
    assert not gpu_evictable(s, HS[0])  # pinned by the write
    assert check(s) == []


@pytest.mark.parametrize(
    ("outcome", "stored"),
    [(Ok(), {HS[0], HS[1]}), (Partial(1), {HS[0]}), (Partial(0), set()), (Error(), set()), (Timeout(), set())],
    ids=str,
)
def test_write_completion_frees_adopted_blocks_and_stores_done_hashes(outcome: Outcome, stored: set[BlockHash]) -> None:
    s = actions.complete(released_with_write(), T0, outcome)
    assert s.stored == stored
    assert G(1) in s.gpu_free and s.gpu_pins == {} and s.transfers == {}
    assert gpu_evictable(s, HS[0])
    assert check(s) == []


# --- each invariant detects a hand-broken state -------------------------------------------


def test_busy_state_is_valid() -> None:
    s = busy()
    assert check(s) == []
    assert s.gpu_pins == {G(3): 1} and s.gpu_free == (G(4), G(5))


def test_inv_conserve_detects_block_both_free_and_owned_by_node() -> None:
    s = busy()
    broken = replace(s, gpu_free=tuple(sorted((*s.gpu_free, G(0)))))
    assert inv_conserve(s) == []
    assert ids(inv_conserve(broken)) == {"INV-CONSERVE"}


def test_inv_conserve_detects_block_owned_by_nobody() -> None:
    s = busy()
    assert ids(inv_conserve(replace(s, gpu_free=s.gpu_free[1:]))) == {"INV-CONSERVE"}


def test_inv_refcount_detects_refcount_off_by_one() -> None:
    s = busy()
    broken = replace(s, nodes={**s.nodes, HS[0]: replace(s.nodes[HS[0]], refcount=2)})
    assert inv_refcount(s) == []
    assert ids(inv_refcount(broken)) == {"INV-REFCOUNT"}


def test_inv_refcount_detects_child_held_more_than_its_parent() -> None:
    s = cached()
    broken = replace(
        s,
        nodes={**s.nodes, HS[1]: replace(s.nodes[HS[1]], refcount=1)},
        requests={R1: Holding((HS[1],), ())},  # holders agree with refcounts; the path skips HS[0]
    )
    found = inv_refcount(broken)
    assert ids(found) == {"INV-REFCOUNT"} and any("> parent" in v.message for v in found)


def test_inv_tree_detects_missing_parent() -> None:
    s = busy()
    broken = replace(s, nodes={**s.nodes, HS[1]: replace(s.nodes[HS[1]], parent=OTHER)})
    assert inv_tree(s) == []
    found = inv_tree(broken)
    assert ids(found) == {"INV-TREE"} and any("missing parent" in v.message for v in found)


def test_inv_tree_detects_gpu_node_under_cpu_parent() -> None:
    s = cached()
    broken = replace(s, nodes={**s.nodes, HS[0]: replace(s.nodes[HS[0]], tier=OnCpu(C(0)))}, cpu_free=(C(1),))
    assert inv_tree(s) == []
    assert ids(inv_tree(broken)) == {"INV-TREE"}


def test_inv_tier_detects_out_of_range_id() -> None:
    s = busy()
    broken = replace(s, nodes={**s.nodes, HS[0]: replace(s.nodes[HS[0]], tier=OnGpu(G(6)))}, gpu_free=(G(0), G(4), G(5)))
    assert inv_tier(s) == []
    assert ids(inv_tier(broken)) == {"INV-TIER"}
    assert inv_conserve(broken) == []  # every in-range block still has one owner: only INV-TIER sees it


def test_inv_tier_detects_gpu_id_in_cpu_free_list() -> None:
    s = busy()
    assert ids(inv_tier(replace(s, cpu_free=(*s.cpu_free, C(5))))) == {"INV-TIER"}


def test_inv_no_uaf_detects_request_listing_free_block() -> None:
    s = busy()
    broken = replace(s, requests={**s.requests, R1: Holding(HS[:2], (G(2), G(4)))})
    assert inv_no_uaf(s) == []
    assert ids(inv_no_uaf(broken)) == {"INV-NO-UAF"}


def test_inv_no_uaf_detects_request_listing_another_requests_block() -> None:
    s = busy()
    broken = replace(s, requests={**s.requests, R0: Holding((), (G(2),))})
    assert ids(inv_no_uaf(broken)) == {"INV-NO-UAF"}


@pytest.mark.parametrize(
    "pins",
    [{}, {GpuBlock(3): 2}, {GpuBlock(3): 1, GpuBlock(0): 1}],
    ids=["write-unpinned", "pinned-twice", "pinned-without-transfer"],
)
def test_inv_pin_detects_pins_not_matching_transfers(pins: dict[GpuBlock, int]) -> None:
    s = busy()
    assert inv_pin(s) == []
    assert ids(inv_pin(replace(s, gpu_pins=pins))) == {"INV-PIN"}


def test_inv_pin_detects_free_block_read_by_transfer() -> None:
    s = replace(swapped_out(), gpu_free=(G(1), G(2), G(3)))
    assert any("free while a transfer reads it" in v.message for v in inv_pin(s))


def test_settle_offers_every_evictable_node_to_its_heap() -> None:
    s = cached()
    assert s.gpu_heap == Heap(frozenset({HS[1]}), frozenset({HS[1]}))  # the leaf; its parent has a GPU child
    s = actions.complete(swapped_out(), T0, Ok())
    assert s.cpu_heap.entries == {HS[1]}


def test_inv_heap_complete_detects_unfindable_evictable_node() -> None:
    s = cached()
    assert inv_heap_complete(s) == []
    assert ids(inv_heap_complete(replace(s, gpu_heap=Heap()))) == {"INV-HEAP-COMPLETE"}


def test_inv_heap_complete_detects_unfindable_cpu_leaf() -> None:
    s = actions.complete(swapped_out(), T0, Ok())
    assert ids(inv_heap_complete(replace(s, cpu_heap=Heap()))) == {"INV-HEAP-COMPLETE"}


def test_inv_heap_sound_detects_dead_node_and_flags_that_disagree() -> None:
    s = cached()
    h = s.gpu_heap
    assert inv_heap_sound(s) == []
    dead = replace(s, gpu_heap=Heap(h.entries | {OTHER}, h.flagged | {OTHER}))
    assert ids(inv_heap_sound(dead)) == {"INV-HEAP-SOUND"}
    dropped = replace(s, gpu_heap=Heap(frozenset(), h.flagged))  # the heap-drop bug: flag kept, entry gone
    assert any("flagged" in v.message for v in inv_heap_sound(dropped))
    unflagged = replace(s, gpu_heap=Heap(h.entries, frozenset()))
    assert any("no flag" in v.message for v in inv_heap_sound(unflagged))


def test_stale_entry_is_popped_and_the_node_offered_again() -> None:
    s = cached()
    s = actions.match(s, R1, HS[:2])  # the leaf is shared again: its entry goes stale
    assert HS[1] in s.gpu_heap.entries and not gpu_evictable(s, HS[1])
    s = actions.evict(s, [actions.SkipStale(HS[1], Tier.GPU)])
    assert HS[1] not in s.gpu_heap.entries | s.gpu_heap.flagged
    s = actions.release(s, R1)
    assert HS[1] in s.gpu_heap.entries  # evictable again: offered again


@pytest.mark.parametrize("name", ["gpu_free", "cpu_free", "gpu_evictable", "cpu_evictable", "gpu_in_use"])
def test_inv_counters_detects_each_wrong_counter(name: str) -> None:
    s = cached()
    assert invariants.inv_counters(counted(s)) == []
    found = invariants.inv_counters(counted(s, name))
    assert ids(found) == {"INV-COUNTERS"} and len(found) == 1 and name in found[0].message


def test_check_runs_counter_checks_only_when_counters_are_reported() -> None:
    s = cached()
    broken = replace(s, gpu_free=(*s.gpu_free, G(0)), gpu_heap=Heap())
    assert ids(check(broken)) == {"INV-CONSERVE", "INV-HEAP-COMPLETE"}
    assert ids(invariants.check(counted(broken, "gpu_free"))) == {"INV-CONSERVE", "INV-HEAP-COMPLETE", "INV-COUNTERS"}


def test_spec_replace_is_dataclasses_replace() -> None:
    """spec.frozen.replace copies fields without calling __init__: equivalent only while
    spec's dataclasses have no __post_init__, no init=False fields and no __slots__."""
    import dataclasses
    import inspect

    from kvoracle.spec import actions, liveness, scheduler, state, types, view
    from kvoracle.spec.frozen import replace

    classes = {c for m in (actions, liveness, scheduler, state, types, view)
               for _, c in inspect.getmembers(m, inspect.isclass) if dataclasses.is_dataclass(c)}
    assert classes, "no dataclass found"
    for c in classes:
        assert not hasattr(c, "__post_init__") and not hasattr(c, "__slots__"), c
        assert all(f.init for f in dataclasses.fields(c)), c
    s = state.initial_system(4, 1, 2, 3)
    assert replace(s, now=5) == dataclasses.replace(s, now=5) and replace(s, now=5) is not s


def _idle(free: tuple[int, ...], queued: frozenset[str] = frozenset({"r0"}), running: frozenset[str] = frozenset()) -> View:
    return View(TierView("GPU", range(4), free=free), live=queued | running, queued=queued)


def test_live_admit_allows_one_stalled_step_then_asks_for_progress() -> None:
    idle = _idle((0, 1, 2, 3))
    why = stall(idle, idle, {"r0": 4}, 4, (0, 0))  # r0 and its next token take the whole pool
    assert why is not None and "r0 (4)" in why
    assert ADMIT_GRACE == 1 and live_admit([why]) == []
    assert [v.id for v in live_admit([why, why])] == ["LIVE-ADMIT"]


def test_a_step_that_admits_starts_a_transfer_or_frees_a_block_does_not_stall() -> None:
    idle, needs = _idle((0, 1)), {"r0": 2}
    assert stall(idle, _idle((), queued=frozenset(), running=frozenset({"r0"})), needs, 4, (0, 0)) is None
    assert stall(idle, idle, needs, 4, (0, 1)) is None  # a swap-out that makes room, a load
    assert stall(idle, _idle((0, 1, 2)), needs, 4, (0, 0)) is None  # a drop


def test_live_admit_asks_nothing_of_an_engine_that_is_busy_or_whose_queue_does_not_fit() -> None:
    idle = _idle((0, 1, 2, 3), queued=frozenset({"r0", "r1"}))
    assert stall(idle, idle, {"r0": 2, "r1": 5}, 4, (0, 0)) is None  # r1 never fits: a FIFO may wait behind it
    assert stall(idle, idle, {"r0": 2}, 4, (0, 0)) is None  # r1's need is unknown
    assert stall(idle, idle, {"r0": 2, "r1": 2}, 3, (0, 0)) is not None
    busy = _idle((0, 1), running=frozenset({"r2"}))
    assert stall(busy, busy, {"r0": 2}, 4, (0, 0)) is None
    assert stall(idle, idle, {"r0": 2, "r1": 2}, 4, (1, 1)) is None  # a transfer in flight


def _busy(computed: dict[str, int], queued: frozenset[str] = frozenset()) -> View:
    return View(TierView("GPU", range(8), free=(7,)), live=frozenset(computed) | queued, queued=queued,
                computed=computed)


def test_live_progress_allows_one_step_that_stands_still_then_asks_for_a_token() -> None:
    """A request that preempts itself and is admitted again in the same step computed
    nothing new: it stands still, however its blocks moved."""
    before = _busy({"r0": 6})
    why = standstill(before, before, {"r0": 4}, 8, (0, 0), {"r0": 6})
    assert why is not None and "r0 (6 tokens, 4 blocks)" in why
    assert PROGRESS_GRACE == 1 and live_progress([why]) == []
    assert [v.id for v in live_progress([why, why])] == ["LIVE-PROGRESS"]


def test_a_step_that_computes_ends_a_request_or_starts_a_transfer_does_not_stand_still() -> None:
    before, needs, seen = _busy({"r0": 6, "r1": 2}), {"r0": 4, "r1": 2}, {"r0": 6, "r1": 2}
    assert standstill(before, _busy({"r0": 7, "r1": 2}), needs, 8, (0, 0), seen) is None  # r0 decoded
    assert standstill(before, _busy({"r0": 6, "r1": 3}), needs, 8, (0, 0), seen) is None  # a prefill chunk of r1
    assert standstill(before, _busy({"r0": 6}), needs, 8, (0, 0), seen) is None  # r1 ended
    assert standstill(before, before, needs, 8, (0, 1), seen) is None  # a swap-out that makes room
    fresh = _busy({"r0": 6, "r1": 2, "r2": 4})  # r2, queued, admitted: its prefill, and no decode
    assert standstill(_busy({"r0": 6, "r1": 2}, queued=frozenset({"r2"})), fresh, needs, 8, (0, 0), seen) is None


def test_recomputing_what_a_preemption_threw_away_is_no_progress() -> None:
    before, needs = _busy({"r0": 6, "r1": 2}), {"r0": 4, "r1": 2}
    after = _busy({"r0": 6}, queued=frozenset({"r1"}))  # r1 preempted, r0 did not grow
    assert standstill(before, after, needs, 8, (0, 0), {"r0": 6, "r1": 2}) is not None
    back = _busy({"r0": 6, "r1": 2})  # r1 admitted again and recomputed: nothing it never had
    assert standstill(after, back, needs, 8, (0, 0), {"r0": 6, "r1": 2}) is not None
    chunk = _busy({"r0": 6, "r1": 1})  # a chunk of its recomputation, running before and after: work
    assert standstill(_busy({"r0": 6, "r1": 0}), chunk, needs, 8, (0, 0), {"r0": 6, "r1": 2}) is None


def test_live_progress_asks_nothing_of_a_request_too_large_to_grow_or_an_engine_waiting_for_a_transfer() -> None:
    before, seen = _busy({"r0": 16, "r1": 2}), {"r0": 16, "r1": 2}
    assert standstill(before, before, {"r0": 9, "r1": 2}, 8, (0, 0), seen) is None  # r0 cannot grow even alone
    assert standstill(before, before, {"r1": 2}, 8, (0, 0), seen) is None  # r0's need is unknown
    assert standstill(before, before, {"r0": 8, "r1": 2}, 8, (1, 1), seen) is None  # a transfer in flight
    idle = _busy({}, queued=frozenset({"r0"}))
    assert standstill(idle, idle, {}, 8, (0, 0), {}) is None  # nothing runs: LIVE-ADMIT's case
    unknown = View(TierView("GPU", range(8), free=(7,)), live=frozenset({"r0"}), queued=frozenset())
    assert standstill(unknown, unknown, {"r0": 2}, 8, (0, 0), {}) is None  # computed tokens not reported


def test_a_transfer_must_be_over_on_the_tick_that_reaches_its_timeout() -> None:
    """As spec's Next: the tick that brings a transfer to `timeout` ticks times it out. Seen
    in flight then, it stays so into the next tick: one tick late is a violation."""
    assert live_transfer({TransferId(1): 10}, now=13, timeout=4) == []
    late = live_transfer({TransferId(1): 10, TransferId(2): 12}, now=14, timeout=4)
    assert [v.message for v in late] == ["transfer 1 still in flight after 4 ticks (timeout 4)"]
