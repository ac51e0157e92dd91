"""Deterministic tests of reference paths that the stateful machines reach rarely: decode
growth, admission at its boundaries, eviction after stale pops and failed swap-ins,
transfer timeouts, swap-in and prefetch with real KV bytes, the storage directory's
durability and format, and the values the reference returns and records.

Each test asserts what spec/ (or the documented contract of the call) guarantees. Where
a test has to rely on a choice spec/ leaves open (LRU order, lazy deletion of heap
entries, taking every CPU or storage hit), its name says so.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
import tempfile
from pathlib import Path

import pytest

from kvoracle.kvcache.abstraction import abstract, check_invariants
from kvoracle.kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, NoFaults, ScriptedFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool import make_pool
from kvoracle.kvcache.errors import RequestTooLarge
from kvoracle.kvcache.storage import DirectoryStorage, MemoryStorage
from kvoracle.kvcache.transfers import SwapOutJob
from kvoracle.scheduler.content import KVPools, content
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec import actions
from kvoracle.spec.actions import Complete, Drop, EvictCpu, EvictStep, SkipStale
from kvoracle.spec.hashing import block_hashes
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Admit, Decode
from kvoracle.spec.state import Status
from kvoracle.spec.types import (
    BlockHash,
    Error,
    Ok,
    OnCpu,
    Outcome,
    Partial,
    RequestId,
    Tier,
    Timeout,
    TransferId,
    gpu_block_of,
)

R0, R1, R2, R3 = RequestId(0), RequestId(1), RequestId(2), RequestId(3)
A, B, C = (block_hashes([t, t], 2)[0] for t in (1, 2, 3))  # three unrelated one-block prefixes


# --- helpers -------------------------------------------------------------------------------


def ok(cache: CacheManager) -> None:
    assert check_invariants(cache) == []


def numpy_pools(gpu: int, cpu: int, block_size: int) -> KVPools:
    return KVPools(make_pool("numpy", "cpu", gpu, block_size, 1, 8),
                   make_pool("numpy", "cpu", max(cpu, 1), block_size, 1, 8))


def manager(
    gpu: int = 8,
    cpu: int = 2,
    *,
    block_size: int = 2,
    policy: WritePolicy = WritePolicy.NONE,
    timeout: int = 3,
    pools: KVPools | None = None,
    storage: MemoryStorage | None = None,
) -> tuple[ResourceManager, ScriptedFaults]:
    plan = ScriptedFaults()
    backend = MemoryStorage() if storage is None else storage
    rm = ResourceManager(CacheManager(gpu, cpu), FaultyStorage(backend, plan), FaultyCopier(plan),
                         block_size=block_size, write_policy=policy, timeout=timeout, pools=pools)
    return rm, plan


def cached_prefix(rm: ResourceManager, tokens: list[int]) -> None:
    """R0 runs `tokens` (admitted, committed, one token decoded) and finishes: its full blocks stay cached."""
    rm.submit(R0, tokens)
    assert rm.schedule() == [R0]
    rm.schedule()
    rm.finish([R0])


def kv_content(rm: ResourceManager) -> list[Violation]:
    """INV-CONTENT over the tree and every ready running request's table."""
    assert rm.pools is not None
    ready = [r for r in rm.running if rm.cache.ready(r)]
    return content(rm.cache, rm.pools, {r: (list(rm.cache.table(r)), rm.seeds(r)) for r in ready})


def table_covers_tokens(rm: ResourceManager) -> bool:
    """INV-REQUEST's clause for running requests: the table covers every token."""
    return all(len(rm.cache.table(r)) * rm.block_size >= len(rm.requests[r].tokens) for r in rm.running)


def cached_leaves(cache: CacheManager, *hashes: BlockHash) -> None:
    """One request per hash computes that single block, commits it and leaves (in this order)."""
    for i, h in enumerate(hashes):
        r = RequestId(100 + i)
        cache.match(r, [h])
        cache.allocate(r, 1)
        assert cache.commit(r, [h]) == 1
        cache.release(r)
    ok(cache)


def all_on_cpu(cache: CacheManager, *hashes: BlockHash) -> CacheManager:
    """Cache these leaves and swap them all out to the CPU tier, successfully."""
    cached_leaves(cache, *hashes)
    rep = cache.evict_gpu(len(hashes))
    assert rep.swap_out is not None
    cache.complete(rep.swap_out, Ok())
    assert all(isinstance(n.tier, OnCpu) for n in cache.tree.walk())
    ok(cache)
    return cache


def cpu_block(cache: CacheManager, h: BlockHash) -> int:
    (n,) = [n for n in cache.tree.walk() if n.hash == h]
    assert isinstance(n.tier, OnCpu)
    return n.tier.cpu


def drain_cpu(cache: CacheManager) -> None:
    """Evict CPU leaves until a round evicts nothing (LIVE-DRAIN bounds the rounds)."""
    for _ in range(cache.cpu.size + 1):
        if not [s for s in cache.evict_cpu(cache.cpu.size).steps if isinstance(s, EvictCpu)]:
            break


def evicted(steps: tuple[EvictStep, ...]) -> tuple[EvictStep, ...]:
    return tuple(s for s in steps if not isinstance(s, SkipStale))


def completions(rm: ResourceManager, t: TransferId) -> list[Outcome]:
    return [e.outcome for e in rm.events if isinstance(e, Complete) and e.transfer == t]


# --- decode --------------------------------------------------------------------------------


def test_each_step_decodes_one_token_and_grows_the_table_at_a_block_boundary() -> None:
    """schedule() decodes one token per ready running request, allocating a block when the table is full."""
    rm, _ = manager()
    rm.submit(R0, [1, 2, 3, 4])
    assert rm.schedule() == [R0]
    assert len(rm.requests[R0].tokens) == 4 and len(rm.cache.table(R0)) == 2
    rm.schedule()  # the 5th token needs a 3rd block
    assert len(rm.requests[R0].tokens) == 5 and len(rm.cache.table(R0)) == 3
    rm.schedule()  # the 6th fits in it
    assert len(rm.requests[R0].tokens) == 6 and len(rm.cache.table(R0)) == 3
    decodes = [e for e in rm.events if isinstance(e, Decode)]
    assert [len(e.blocks) for e in decodes] == [1, 0] and decodes[0].blocks[0] == rm.cache.table(R0)[2]
    ok(rm.cache)


def test_decode_after_an_eviction_round_of_only_stale_entries_still_makes_room() -> None:
    """A decode that finds no free block evicts or preempts until it has one: OutOfBlocks never escapes schedule()."""
    rm, _ = manager(4, 0)
    cached_prefix(rm, [1, 2, 3, 4])  # 2 cached nodes, 2 free blocks
    rm.submit(R1, [1, 2, 3, 4, 9, 9])  # shares the cached prefix: its leaf's heap entry goes stale
    rm.submit(R2, [7, 7])
    rm.schedule()
    rm.schedule()  # R1's decode needs a block while none is free and only a stale entry is in the heap
    assert table_covers_tokens(rm)
    assert len(rm.requests[R1].tokens) == 7 or rm.requests[R1].status is Status.PREEMPTED
    ok(rm.cache)


# --- admission -----------------------------------------------------------------------------


def test_admission_evicts_cached_blocks_to_make_room() -> None:
    """A waiting request that fits once unreferenced cached blocks are evicted is admitted (LIVE-EVICT)."""
    rm, _ = manager(4, 0)
    cached_prefix(rm, [1, 2, 3, 4, 5, 6])  # 3 cached nodes, 1 free block
    rm.submit(R1, [7, 7, 8, 8, 9])  # 3 blocks, none cached
    assert rm.schedule() == [R1]
    assert len(rm.cache.table(R1)) == 3
    ok(rm.cache)


def test_admission_evicts_when_short_by_exactly_one_block() -> None:
    """Admission evicts even when it lacks a single block."""
    rm, _ = manager(4, 0)
    cached_prefix(rm, [1, 2, 3, 4])  # 2 cached nodes, 2 free blocks
    rm.submit(R1, [7, 7, 8, 8, 9])  # 3 blocks
    assert rm.schedule() == [R1]
    ok(rm.cache)


def test_admission_counts_cached_prefix_hits_against_its_need() -> None:
    """A request whose prefix is cached on the GPU needs free blocks only for the rest, and takes the cached ones."""
    rm, _ = manager(4, 0)
    cached_prefix(rm, [1, 2, 3, 4])  # 2 cached nodes, 2 free blocks
    prefix = sorted(g for n in rm.cache.tree.walk() if n.tier is not None and (g := gpu_block_of(n.tier)) is not None)
    rm.submit(R1, [1, 2, 3, 4, 5])  # 3 blocks, 2 of them cached
    assert rm.schedule() == [R1]
    assert sorted(rm.cache.table(R1)[:2]) == prefix
    ok(rm.cache)


def test_admission_fits_exactly_the_free_blocks() -> None:
    """A request that needs exactly the free blocks is admitted."""
    rm, _ = manager(4, 0)
    rm.submit(R0, [9])
    assert rm.schedule() == [R0]  # holds 1 block, 3 free
    rm.submit(R1, [1, 2, 3, 4, 5])  # needs 3
    assert rm.schedule() == [R1]
    assert rm.cache.gpu.num_free == 0
    ok(rm.cache)


def test_request_too_large_boundary() -> None:
    """A prompt is accepted exactly when its blocks, with room for one more token, fit the GPU tier."""
    rm, _ = manager(2, 0)
    rm.submit(R0, [1, 2, 3])  # blocks_for(4) == 2 == G
    with pytest.raises(RequestTooLarge):
        rm.submit(R1, [1, 2, 3, 4])  # blocks_for(5) == 3


def test_resource_manager_accepts_block_size_and_timeout_of_one() -> None:
    """Block size 1 and timeout 1 (the spec's own scopes) are valid."""
    rm = ResourceManager(CacheManager(2), FaultyStorage(MemoryStorage(), NoFaults()), FaultyCopier(NoFaults()),
                         block_size=1, timeout=1)
    assert (rm.block_size, rm.timeout) == (1, 1)


@pytest.mark.parametrize(("block_size", "timeout"), [(0, 4), (2, 0), (-1, 1), (1, -1)])
def test_resource_manager_refuses_a_block_size_or_timeout_below_one(block_size: int, timeout: int) -> None:
    """The constructor refuses a block size or a timeout below 1 with ValueError."""
    with pytest.raises(ValueError):
        ResourceManager(CacheManager(2), FaultyStorage(MemoryStorage(), NoFaults()), FaultyCopier(NoFaults()),
                        block_size=block_size, timeout=timeout)


# --- eviction after stale pops and failed swap-ins (CacheManager) ------------------------------


def test_cpu_eviction_after_a_failed_swap_in_drains_the_cpu_tier() -> None:
    """A swap-in that fails for a live request leaves its node CPU-evictable; eviction never raises (LIVE-EVICT)."""
    cache = all_on_cpu(CacheManager(4, 2), A, B)
    m = cache.match(R3, [A])
    assert m.swap_in is not None
    cache.complete(m.swap_in, Error())  # R3 still live: its GPU block turns private, A stays on CPU
    ok(cache)
    drain_cpu(cache)
    assert cache.cpu.num_free == 2
    ok(cache)


def test_cpu_eviction_during_a_swap_in_that_then_fails_drains_the_cpu_tier() -> None:
    """CPU eviction while a node swaps in, then the swap-in's failure, leaves every CPU leaf evictable (LIVE-EVICT)."""
    cache = all_on_cpu(CacheManager(4, 3), A, B, C)
    m = cache.match(R3, [A])
    assert m.swap_in is not None
    assert len(evicted(cache.evict_cpu(1).steps)) == 1
    cache.complete(m.swap_in, Error())
    ok(cache)
    drain_cpu(cache)
    assert cache.cpu.num_free == 3
    ok(cache)


def test_eviction_takes_the_least_recently_used_leaf_under_lru_order() -> None:
    """Under the reference's LRU order (spec/ allows any), a leaf used again is evicted after an older one."""
    cache = CacheManager(4, 0)
    cached_leaves(cache, A, B)
    cache.match(R3, [A])
    cache.release(R3)  # A used again: B is now the least recently used
    assert cache.evict_gpu(1).steps == (Drop(B),)
    ok(cache)


def test_cpu_eviction_skips_only_the_node_whose_block_is_pinned() -> None:
    """A swap-in pins its own CPU block only: every other CPU leaf stays evictable."""
    cache = all_on_cpu(CacheManager(4, 2), A, B)
    pinned = A if cpu_block(cache, A) == 0 else B  # the node on CPU block 0, whichever it is
    other = B if pinned == A else A
    assert cache.match(R3, [pinned]).swap_in is not None
    rep = cache.evict_cpu(2)
    assert evicted(rep.steps) == (EvictCpu(other),)
    ok(cache)


def test_cpu_stale_pops_replay_through_spec_under_lazy_deletion() -> None:
    """A stale CPU entry popped by eviction is reported on the CPU tier, and the steps replay through spec/."""
    cache = all_on_cpu(CacheManager(4, 2), A, B)
    assert cache.match(R3, [A]).swap_in is not None  # A's CPU entry goes stale (lazy deletion keeps it)
    before = abstract(cache)
    rep = cache.evict_cpu(2)
    assert SkipStale(A, Tier.CPU) in rep.steps
    assert all(s.tier is Tier.CPU for s in rep.steps if isinstance(s, SkipStale))
    assert actions.evict(before, rep.steps) == abstract(cache)
    ok(cache)


def test_gpu_stale_pop_is_reported_on_the_gpu_tier_under_lazy_deletion() -> None:
    """A stale GPU entry popped by eviction is reported as SkipStale on the GPU tier and replays through spec/."""
    cache = CacheManager(4, 0)
    cached_leaves(cache, A)
    cache.match(R3, [A])  # A is shared again: its heap entry is stale
    before = abstract(cache)
    rep = cache.evict_gpu(1)
    assert rep.steps == (SkipStale(A, Tier.GPU),)
    assert actions.evict(before, rep.steps) == abstract(cache)
    ok(cache)


def test_commit_returns_the_number_of_new_nodes() -> None:
    """commit returns how many nodes it made, 0 when the first hash is already cached."""
    cache = CacheManager(4)
    hs = block_hashes([1, 1, 2, 2], 2)
    for r in (R1, R2):
        cache.match(r, hs)
        cache.allocate(r, 2)
    assert cache.commit(R1, hs) == 2
    assert cache.commit(R2, hs) == 0
    ok(cache)


def test_complete_reports_its_job_and_the_items_done() -> None:
    """complete returns the job that ended and how many leading items succeeded."""
    cache = CacheManager(4, 2)
    cached_leaves(cache, A, B)
    rep = cache.evict_gpu(2)
    assert rep.swap_out is not None and len(cache.jobs[rep.swap_out].items) == 2
    done = cache.complete(rep.swap_out, Partial(1))
    assert isinstance(done.job, SwapOutJob) and done.job.id == rep.swap_out and done.done == 1
    ok(cache)


# --- transfers: timeouts, answers, the journal ------------------------------------------------


def started_write(rm: ResourceManager, plan: ScriptedFaults, fault: Fault) -> TransferId:
    """R0 runs one full block and finishes; its storage write gets `fault`."""
    rm.submit(R0, [1, 2, 3])
    rm.schedule()
    plan.push(fault)
    rm.finish([R0])
    (t,) = rm.in_flight()
    return t


def test_a_hung_transfer_times_out_timeout_ticks_after_it_started() -> None:
    """A transfer that never answers times out once it has been in flight `timeout` ticks, counted from its start."""
    rm, plan = manager(policy=WritePolicy.ON_FINISH, timeout=3)
    rm.tick(5)  # the clock is well past `timeout` before the transfer starts
    t = started_write(rm, plan, Fault(FaultKind.HANG))
    still = []
    for _ in range(3):
        rm.tick(1)
        still.append(t in rm.in_flight())
    assert still == [True, True, False]
    assert completions(rm, t) == [Timeout()]


@pytest.mark.parametrize("delay", [2, 3])
def test_a_late_answer_within_the_timeout_is_delivered(delay: int) -> None:
    """An answer that comes before the timeout completes the transfer with its own
    outcome; one due on the deadline tick too (the reference's order within a tick, which
    spec leaves open: what is due now is delivered, then what has run `timeout` ticks
    times out), not thrown away as stale."""
    rm, plan = manager(policy=WritePolicy.ON_FINISH, timeout=3)
    rm.tick(5)
    t = started_write(rm, plan, Fault(FaultKind.LATE, delay=delay))
    rm.tick(delay - 1)
    assert t in rm.in_flight()
    rm.tick(1)
    assert completions(rm, t) == [Ok()] and rm.stats.timeouts == 0
    assert set(rm.hashes(R0)) <= rm.cache.stored


def test_a_raising_write_is_journaled_as_an_error_answer() -> None:
    """An I/O call that raises is an `error` answer to its transfer, recorded as such."""
    rm, plan = manager(policy=WritePolicy.ON_FINISH)
    rm.submit(R0, [1, 2, 3])
    rm.schedule()
    plan.push(Fault(FaultKind.RAISE))
    rm.finish([R0])
    (c,) = [e for e in rm.events if isinstance(e, Complete)]
    assert c.outcome == Error() and rm.in_flight() == []


def test_ended_transfers_leave_the_started_record() -> None:
    """A transfer that ends leaves `started`, and the manager keeps no data of it."""
    rm, _ = manager(6, 0, policy=WritePolicy.ON_FINISH)
    cached_prefix(rm, [1, 2, 3, 4])  # written to storage on finish
    rm.evict_all()
    rm.submit(R1, [1, 2, 3, 4, 5])
    rm.schedule()
    rm.tick(1)
    assert rm.in_flight() == []
    assert any(isinstance(e, Complete) for e in rm.events)
    assert rm.started == {} and rm._reads == {}


def test_tick_defaults_to_one_tick() -> None:
    """tick() with no argument advances the clock by one tick."""
    rm, _ = manager()
    rm.tick()
    assert rm.now == 1


# --- swap-in, prefetch and short prompts with KV pools -----------------------------------------


def both_blocks_on_cpu(rm: ResourceManager) -> None:
    """R0's two cached blocks end on the CPU tier, each swapped out by an admission that needed its GPU block."""
    cached_prefix(rm, [1, 2, 3, 4])  # nodes A <- B cached, 2 of 4 GPU blocks free
    for r, tokens in ((RequestId(10), [7, 7, 8, 8, 9]), (RequestId(11), [5, 5, 6, 6, 7, 7, 8])):
        rm.submit(r, tokens)  # 3, then 4 blocks: short by one, the one evictable leaf (B, then A) goes
        assert rm.schedule() == [r]
        rm.finish([r])  # before it commits: its blocks are freed
    assert rm.cache.tree.size == 2 and all(isinstance(n.tier, OnCpu) for n in rm.cache.tree.walk())


@pytest.mark.parametrize("fault", [None, Fault(FaultKind.PARTIAL, done=1), Fault(FaultKind.ERROR)],
                         ids=["ok", "partial(1)", "error"])
def test_swap_in_with_kv_pools_keeps_content_under_every_hit_taken(fault: Fault | None) -> None:
    """A swap-in, whole, partial or failed, leaves every reachable block with its prefix's bytes (INV-CONTENT)."""
    rm, plan = manager(4, 3, pools=numpy_pools(4, 3, 2))
    both_blocks_on_cpu(rm)
    assert kv_content(rm) == []
    if fault is not None:
        plan.push(fault)
    rm.submit(R1, [1, 2, 3, 4, 5])
    assert rm.schedule() == [R1]
    admit = [e for e in rm.events if isinstance(e, Admit) and e.request == R1][-1]
    assert len(admit.swap_dests) == 2  # every CPU hit taken (spec/ allows fewer)
    rm.tick(1)
    rm.schedule()
    assert rm.requests[R1].status is Status.RUNNING and rm.cache.ready(R1)
    assert kv_content(rm) == []
    ok(rm.cache)


def test_prefetched_bytes_come_from_storage_under_every_hit_taken() -> None:
    """A prefetch copies the bytes storage returned into its GPU blocks: altered stored bytes show as INV-CONTENT."""
    mem = MemoryStorage()
    rm, _ = manager(6, 0, policy=WritePolicy.ON_FINISH, pools=numpy_pools(6, 0, 2), storage=mem)
    cached_prefix(rm, [1, 2, 3, 4])  # both full blocks written
    rm.evict_all()  # no CPU tier: dropped, only storage holds them
    stored = list(rm.hashes(R0))
    assert rm.cache.tree.size == 0 and mem.exists(stored) == 2
    mem.write([(h, bytes(255 - b for b in d)) for h, d in zip(stored, mem.read(stored))])  # same size, other bytes
    rm.submit(R1, [1, 2, 3, 4, 5])
    assert rm.schedule() == [R1]
    admit = [e for e in rm.events if isinstance(e, Admit) and e.request == R1][-1]
    assert len(admit.prefetch_dests) == 2  # every storage hit taken (spec/ allows fewer)
    rm.schedule()
    found = kv_content(rm)
    assert found and {v.id for v in found} == {"INV-CONTENT"}


def test_a_prompt_shorter_than_one_block_runs_with_kv_pools() -> None:
    """A prompt shorter than one block is admitted, decoded and holds the right bytes."""
    rm, _ = manager(6, 0, block_size=4, pools=numpy_pools(6, 0, 4))
    rm.submit(R0, [1, 2])
    assert rm.schedule() == [R0]
    rm.schedule()
    assert len(rm.requests[R0].tokens) == 3
    assert kv_content(rm) == []
    ok(rm.cache)


# --- counters ----------------------------------------------------------------------------------


def test_stats_and_preemptions_count_each_lifecycle_event() -> None:
    """rm.stats and Request.preemptions count admissions, exits, blocks, I/O raises, timeouts and stale answers."""
    rm, plan = manager(8, 2, policy=WritePolicy.ON_FINISH, timeout=3)
    rm.submit(R0, [1, 1, 2, 2])
    rm.schedule()  # admitted: 2 blocks allocated
    rm.schedule()  # commit, decode: a 3rd block
    for _ in range(2):
        rm.preempt(R0)
        rm.schedule()  # re-admitted: 2 GPU hits, 1 block allocated
    assert rm.requests[R0].preemptions == 2
    rm.submit(R1, [3, 3])
    rm.schedule()  # R0 decodes without growing; R1 admitted: 1 block
    rm.submit(RequestId(5), [9])
    rm.abort(RequestId(5))  # aborted while waiting
    rm.abort(R1)  # aborted while running
    plan.push(Fault(FaultKind.RAISE))
    rm.finish([R0])
    rm.submit(R2, [4, 4])
    rm.submit(RequestId(4), [5, 5])
    rm.schedule()  # 1 block each
    plan.push(Fault(FaultKind.LATE, delay=5))
    plan.push(Fault(FaultKind.LATE, delay=5))
    rm.finish([R2, RequestId(4)])
    rm.tick(3)  # both writes time out
    rm.tick(2)  # both late answers arrive after the timeout
    rm.submit(RequestId(6), [6, 6])
    rm.schedule()  # 1 block
    plan.push(Fault(FaultKind.RAISE))
    rm.finish([RequestId(6)])
    s = rm.stats
    assert (s.admitted, s.preempted, s.finished, s.aborted) == (7, 2, 4, 2)
    assert (s.prompt_blocks, s.hit_blocks) == (2 + 2 + 2 + 1 + 1 + 1 + 1, 2 + 2)
    assert (s.io_raised, s.timeouts, s.stale_answers) == (2, 2, 2)
    assert s.block_ops == (2 + 1 + 1 + 1) + 1 + 1 + 1 + 1  # blocks allocated (no eviction yet)
    before, seen = s.block_ops, len(rm.events)
    rm.evict_all()  # nothing on CPU: every eviction step is a GPU one
    steps = sum(len(e.steps) for e in rm.events[seen:] if isinstance(e, actions.Evict))
    assert steps and s.block_ops == before + steps
    ok(rm.cache)


def test_hit_blocks_count_the_blocks_swapped_in_and_prefetched_too() -> None:
    """A hit is a prompt block admission need not compute: found on the GPU, or on its way
    there from the CPU tier or storage (the twenty-fifth blind run counted GPU hits only)."""
    for cpu, policy, how in ((2, WritePolicy.NONE, "swap_dests"), (0, WritePolicy.ON_FINISH, "prefetch_dests")):
        rm, _ = manager(8, cpu, policy=policy)
        rm.submit(R0, [1, 1, 2, 2, 3])
        rm.schedule()
        rm.schedule()  # the prompt's two full blocks committed
        rm.finish([R0])  # written to storage where the policy says so
        rm.evict_all()  # the leaf swapped out to the CPU tier, or both blocks dropped
        rm.tick(1)
        before = rm.stats.hit_blocks
        rm.submit(R1, [1, 1, 2, 2, 3])
        rm.schedule()
        admit = next(e for e in reversed(rm.events) if isinstance(e, Admit))
        assert getattr(admit, how), (how, admit)  # the path under test: swapped in, or prefetched
        assert rm.stats.hit_blocks - before == 2, how


# --- DirectoryStorage: hash range, durability, format -----------------------------------------


def test_directory_storage_hash_zero_is_a_valid_block(tmp_path: Path) -> None:
    """Hash 0 is a 64-bit value like any other: it is written, read and found."""
    s = DirectoryStorage(tmp_path)
    assert s.write([(BlockHash(0), b"x")]) == 1
    assert 0 in s and s.read([BlockHash(0)]) == [b"x"] and s.exists([BlockHash(0)]) == 1


@pytest.mark.parametrize("h", [1 << 64, (1 << 65) - 1, -1])
def test_directory_storage_membership_outside_64_bits_is_false(tmp_path: Path, h: int) -> None:
    """`h in storage` answers False for a hash no file can name, without raising."""
    s = DirectoryStorage(tmp_path)
    s.write([(BlockHash(5), b"x")])
    assert (h in s) is False


@pytest.mark.skipif(os.name != "posix", reason="the directory is synced on POSIX only")
def test_directory_write_reports_nothing_durable_when_the_directory_sync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose directory sync fails reports 0 blocks durable: the renames may not be on disk."""
    s = DirectoryStorage(tmp_path)
    real_open = os.open

    def failing(path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if Path(path) == tmp_path:
            raise OSError("injected: directory cannot be opened for fsync")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", failing)
    assert s.write([(BlockHash(5), b"a"), (BlockHash(6), b"b")]) == 0
    monkeypatch.setattr(os, "open", real_open)
    fsync = os.fsync

    def failing_for_directories(fd: int) -> None:  # opened, then its sync fails (an I/O error)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "injected: the directory's sync failed")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_for_directories)
    assert s.write([(BlockHash(7), b"c")]) == 0


@pytest.mark.skipif(os.name != "posix", reason="the directory is synced on POSIX only")
def test_directory_write_syncs_each_block_file_before_its_rename_then_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durable is what a crash leaves: each block's file is on disk before it takes the
    block's name, and the names are once the directory is synced after the renames."""
    s = DirectoryStorage(tmp_path)
    seen: list[tuple[str, int]] = []  # (what, the inode it was done to)
    fsync, rename = os.fsync, os.replace

    def syncing(fd: int) -> None:
        st = os.fstat(fd)
        seen.append(("sync directory" if stat.S_ISDIR(st.st_mode) else "sync file", st.st_ino))
        fsync(fd)

    def renaming(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("rename", os.stat(src).st_ino))
        rename(src, dst)

    monkeypatch.setattr(os, "fsync", syncing)
    monkeypatch.setattr(os, "replace", renaming)
    assert s.write([(BlockHash(5), b"a"), (BlockHash(6), b"b")]) == 2
    renamed = [ino for what, ino in seen if what == "rename"]
    assert len(renamed) == 2
    for ino in renamed:
        assert ("sync file", ino) in seen and seen.index(("sync file", ino)) < seen.index(("rename", ino))
    assert seen[-1][0] == "sync directory"


def test_directory_temp_files_are_made_in_the_storage_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file is created next to its block file (an atomic rename), not in the system temp dir."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    s = DirectoryStorage(tmp_path / "blocks")
    assert s.write([(BlockHash(7), b"a")]) == 1
    assert s.read([BlockHash(7)]) == [b"a"]


def test_directory_file_layout_is_the_documented_one(tmp_path: Path) -> None:
    """A block file is magic, payload length (u64 LE), blake2b-16 of (hash u64 LE + payload), payload."""
    h, payload = BlockHash(0x0123_4567_89AB_CDEF), b"some kv bytes"
    DirectoryStorage(tmp_path).write([(h, payload)])
    digest = hashlib.blake2b(h.to_bytes(8, "little") + payload, digest_size=16).digest()
    want = b"KVB1" + struct.pack("<Q", len(payload)) + digest + payload
    assert (tmp_path / f"{h:016x}").read_bytes() == want
