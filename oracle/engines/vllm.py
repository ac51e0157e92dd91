"""vLLM's KVCacheManager and BlockPool (0.11.2 .. 0.34.0; vllm.v1.core) behind the adapter Protocol.

admit  = get_computed_blocks + allocate_slots for the whole prompt (allocate_slots
         also caches the full blocks); refused when allocate_slots returns None
grow   = append_output_token_ids + allocate_slots for the new tokens
finish = KVCacheManager.free (cached blocks stay in the free queue, evictable)
evict  = BlockPool.evict_blocks of up to n cached blocks in the free queue (vLLM
         otherwise evicts lazily, when get_new_blocks reuses a cached free block)

Block 0 is vLLM's null block and is never handed out; the usable ids are 1..N-1.
Runs in `.venv-vllm` (`make engines`); importing this module does not import vLLM (the
setup text is written for the installed release, read from its package metadata).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted
from kvoracle.oracle.engines import require_release
from kvoracle.oracle.engines.vllm_connector import (CPU_PLATFORM, DECODER_ONLY, NEWEST, REQUEST_ARGS, cpu_engine,
                                                    evict_cached, vllm_version)

BLOCK = 4
NUM_BLOCKS = 7  # the null block and 6 usable
MAX_LEN = 256

# The KVCacheManager calls the setup makes changed between releases; each is written for the
# installed release. Checked (with the Scheduler adapter's) on a release of every minor from 0.11 to 0.34
# (0.11.2, 0.12.0, 0.13.0, 0.14.1, 0.15.1, 0.16.0, 0.17.1, 0.18.0, 0.19.0, 0.20.2, 0.21.0 .. 0.25.1, 0.26.0,
# 0.27.1, 0.28.0 .. 0.34.0); the gates read from the sources of every release between from 0.15.1, and of
# 0.11.2, 0.12.0, 0.13.0, 0.14.0 and 0.14.1 below it.
OLDEST_BLOCK_POOL = (0, 11, 2)
# KVCacheManager's constructor takes a required scheduler_block_size before hash_block_size
# from 0.23.0 (PR 44165); up to 0.22.1 it takes hash_block_size alone, and refuses the keyword.
SCHEDULER_BLOCK_SIZE_FROM = (0, 23, 0)
# ... and hash_block_size, required, from 0.12.0 (block hashes at a granularity of their own); up
# to 0.11.2 the constructor takes neither.
HASH_BLOCK_SIZE_FROM = (0, 12, 0)
# get_computed_blocks answers (blocks, hit tokens, shared_prefix_boundary) from 0.26.0 (the
# junction a sparse-retention group pins; 0 here, one full-attention group); up to 0.25.1 it
# answers (blocks, hit tokens).
PREFIX_BOUNDARY_FROM = (0, 26, 0)
# allocate_slots refused for want of blocks leaves the request no entry in req_to_blocks from
# 0.14.0 (get_num_blocks_to_allocate reads it with .get); up to 0.13.0 it reads the defaultdict
# by key, which leaves the refused request an empty list there until it is admitted or freed. An
# empty list holds no block: the observation leaves it out on those releases only.
NO_EMPTY_ENTRY_FROM = (0, 14, 0)


def common(block: int, blocks: int, max_len: int) -> str:
    """What both setups share: the block hasher, the KV cache layout, requests."""
    return f"""\
import inspect
import os
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM first looks for a platform
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher({block}, sha256)
""" + REQUEST_ARGS + f"""
layer = FullAttentionSpec(block_size={block}, num_kv_heads=1, head_size=8, dtype=torch.float16)
config = KVCacheConfig(num_blocks={blocks}, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], layer)])


def request(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens={max_len}), None, block_hasher=hasher, **_request_args)
"""


def manager_sizes(block: int, vllm: tuple[int, ...]) -> str:
    """The block sizes KVCacheManager's constructor takes in release `vllm`, as keyword
    arguments after max_model_len (SCHEDULER_BLOCK_SIZE_FROM, HASH_BLOCK_SIZE_FROM)."""
    sizes = f", scheduler_block_size={block}" if vllm >= SCHEDULER_BLOCK_SIZE_FROM else ""
    return sizes + (f", hash_block_size={block}" if vllm >= HASH_BLOCK_SIZE_FROM else "")


def manager_preamble(block: int = BLOCK, blocks: int = NUM_BLOCKS, max_len: int = MAX_LEN,
                     vllm: tuple[int, ...] = ()) -> str:
    """The KVCacheManager setup, and admit (= match, then place) and grow as the
    scheduler calls them; the bench builds it at its own size. Written for release `vllm`
    (default: the installed one; the newest when none is)."""
    vllm = vllm or vllm_version() or NEWEST
    sizes = manager_sizes(block, vllm)
    answer = "hit, hit_tokens, _" if vllm >= PREFIX_BOUNDARY_FROM else "hit, hit_tokens"
    return common(block, blocks, max_len) + f"""
from vllm.v1.core.kv_cache_manager import KVCacheManager

mgr = KVCacheManager(config, max_model_len={max_len}{sizes})
pool = mgr.block_pool


def match(req):
    {answer} = mgr.get_computed_blocks(req)
    return hit, hit_tokens


def place(req, matched):  # None: no room
    hit, hit_tokens = matched
    got = mgr.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens, hit)
    if got is not None:
        req.num_computed_tokens = req.num_tokens
    return got


def admit(req):
    matched = match(req)
    return place(req, matched), matched[1]


def grow(req, tokens):
    req.append_output_token_ids(tokens)
    got = mgr.allocate_slots(req, len(tokens))
    if got is None:  # undo the append, as a scheduler that cannot grow would not sample
        del req._output_token_ids[-len(tokens):], req._all_token_ids[-len(tokens):]
        del req.block_hashes[req.num_tokens // {block}:]
    else:
        req.num_computed_tokens = req.num_tokens
    return got
""" + evict_cached(vllm)


PREAMBLE = manager_preamble()


@functools.cache
def installed() -> tuple[int, ...]:
    """The installed release (the newest when none is), read once."""
    return vllm_version() or NEWEST


def empty_entries() -> bool:
    """Whether the installed release leaves a refused request an empty req_to_blocks entry
    (NO_EMPTY_ENTRY_FROM)."""
    return installed() < NO_EMPTY_ENTRY_FROM


def held_tables(tables: Any) -> dict[str, tuple[int, ...]]:
    """A manager's req_to_blocks as tables of block ids (without the empty entries of a
    release that leaves them: empty_entries)."""
    empty = empty_entries()
    return {rid: tuple(b.block_id for b in blocks) for rid, blocks in tables.items() if blocks or not empty}


# The full Scheduler needs a model config but no weights: the tiny Llama of cpu_engine, no
# tokenizer, and the KV cache size given by hand.
SCHEDULER_PREAMBLE = """\
import json, logging, os, tempfile
os.environ.update(HF_HUB_OFFLINE="1")
logging.getLogger("vllm").setLevel(logging.ERROR)  # notes about CPU performance, at every construction
""" + cpu_engine(installed()) + common(BLOCK, NUM_BLOCKS, MAX_LEN) + CPU_PLATFORM + f"""
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

cache_config = CacheConfig(block_size={BLOCK}, enable_prefix_caching=True)
cache_config.num_gpu_blocks = {NUM_BLOCKS}
""" + DECODER_ONLY + f"""vllm_config = cpu_vllm_config(
    model_config=ModelConfig(model=model, skip_tokenizer_init=True, max_model_len={MAX_LEN}, dtype="float16"),
    cache_config=cache_config,
    scheduler_config=SchedulerConfig(max_num_batched_tokens={MAX_LEN}, max_num_seqs=4, max_model_len={MAX_LEN},
                                     **_decoder_only),
)
sched = Scheduler(vllm_config, config, StructuredOutputManager(vllm_config), block_size={BLOCK})
mgr = sched.kv_cache_manager
pool = mgr.block_pool


def step(token=1):  # one engine step: schedule, then every scheduled request samples `token`
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    ran = runner_output(ids, [[token] for _ in ids])
    sched.update_from_output(out, ran)
""" + evict_cached(installed())

ASSERTIONS = """\
# kvoracle's checks, in vLLM's own terms
from collections import Counter
free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
tables = mgr.coordinator.single_type_managers[0].req_to_blocks
held = Counter(i for blocks in tables.values() for i in {b.block_id for b in blocks})
assert len(free) == len(set(free)), f"INV-CONSERVE: free queue {free} lists a block twice"
assert not set(held) & set(free), f"INV-NO-UAF: blocks {set(held) & set(free)} are held and free"
for b in pool.blocks[1:]:
    assert b.ref_cnt >= 0, f"INV-REFCOUNT: block {b.block_id} has ref_cnt {b.ref_cnt}"
    assert b.ref_cnt == held[b.block_id], f"INV-REFCOUNT: block {b.block_id} has ref_cnt {b.ref_cnt}, held by {held[b.block_id]}"
assert pool.get_num_free_blocks() == len(free), f"INV-COUNTERS: {pool.get_num_free_blocks()} free reported, {len(free)} queued"
if not held:  # nothing holds a block: every usable block is back in the free queue
    assert len(set(free)) == len(pool.blocks) - 1, f"LIVE-DRAIN: only {len(set(free))} of {len(pool.blocks) - 1} blocks are free"
"""


class VllmAdapter(Scripted):
    name = "vllm"
    block_size = BLOCK
    operations = frozenset({Op.ADMIT, Op.GROW, Op.FINISH, Op.EVICT})
    bad_inputs = frozenset({BadInput.DOUBLE_FREE, BadInput.DOUBLE_FINISH})
    preamble = PREAMBLE
    assertions = ASSERTIONS
    # the calls that changed are chosen by release (HASH_BLOCK_SIZE_FROM, SCHEDULER_BLOCK_SIZE_FROM,
    # PREFIX_BOUNDARY_FROM, EVICT_BLOCKS_FROM, NO_EMPTY_ENTRY_FROM, and eos_token_id where Request
    # takes it); checked from 0.11.2
    releases = (OLDEST_BLOCK_POOL, NEWEST)

    def __init__(self) -> None:
        require_release("vLLM", vllm_version(), *self.releases, type(self).__name__)
        super().__init__()

    def bind(self) -> None:
        self.mgr: Any = self.namespace["mgr"]
        self.pool: Any = self.namespace["pool"]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        self.run(f"{rid} = request({rid!r}, {list(tokens)})")
        reply: Any = self.run(f"_ = admit({rid})")
        got, hit_tokens = reply
        if got is None:
            raise NoRoom(f"allocate_slots refused {rid}")
        return int(hit_tokens) // BLOCK

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        raise NotImplementedError("Op.PREFILL is not declared: admit places the whole prompt")

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        if self.run(f"_ = grow({rid}, {list(tokens)})") is None:
            raise NoRoom(f"allocate_slots refused growing {rid}")

    def finish(self, rid: str) -> None:
        self.run(f"mgr.free({rid})")

    def evict(self, blocks: int) -> int:
        idle = [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None]
        if not idle:
            return 0
        self.run(f"evict_cached({idle[:blocks]})")
        return len(idle[:blocks])

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        if kind is BadInput.DOUBLE_FREE:
            free = self.pool.free_block_queue.get_all_free_blocks()
            if not free:
                return False
            self.run_bad(f"pool.free_blocks([pool.blocks[{free[0].block_id}]])")
            return True
        if kind is BadInput.DOUBLE_FINISH and rid is not None and rid in self.namespace:
            self.run_bad(f"mgr.free({rid})")
            return True
        return False

    def observe(self) -> Observation:
        queue = self.pool.free_block_queue.get_all_free_blocks()
        tables = self.mgr.coordinator.single_type_managers[0].req_to_blocks
        return Observation(
            ids=range(1, NUM_BLOCKS),
            free=tuple(b.block_id for b in queue if b.block_hash is None),
            evictable=tuple(b.block_id for b in queue if b.block_hash is not None),
            tables=held_tables(tables),
            cached=frozenset(b.block_id for b in self.pool.blocks[1:] if b.block_hash is not None),
            refcounts={b.block_id: b.ref_cnt for b in self.pool.blocks[1:]},
            counters={"get_num_free_blocks": (self.pool.get_num_free_blocks(), len(queue))},
        )


class VllmSchedulerAdapter(VllmAdapter):
    """vLLM's full v1 `Scheduler`: it decides who runs, grows every running request by
    one token per step, and preempts (last admitted first) when a request cannot grow.

    admit  = add_request, then one engine step (the request runs, or waits)
    grow   = one engine step: every running request samples one token
    finish = finish_requests(FINISHED_ABORTED) (the abort path; a request that stops
             normally takes the same free in update_from_output)
    """

    name = "vllm-scheduler"
    operations = frozenset({Op.ADMIT, Op.GROW, Op.FINISH, Op.EVICT})
    preamble = SCHEDULER_PREAMBLE
    # the CPU platform picked and SchedulerConfig's arguments read as the connector does, and what
    # the model runner returns written for the release (runner_output)
    releases = (OLDEST_BLOCK_POOL, NEWEST)

    def bind(self) -> None:
        super().bind()
        self.sched: Any = self.namespace["sched"]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        cached = {b.block_id for b in self.pool.blocks[1:] if b.block_hash is not None}
        self.run(f"sched.add_request(request({rid!r}, {list(tokens)}))")
        self.run("step()")
        table = self.mgr.coordinator.single_type_managers[0].req_to_blocks.get(rid, [])
        return len([b for b in table if b.block_id in cached])

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        self.run("step()")

    def finish(self, rid: str) -> None:
        self.run(f"sched.finish_requests({rid!r}, RequestStatus.FINISHED_ABORTED)")

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        if kind is BadInput.DOUBLE_FINISH and rid is not None:
            self.run_bad(f"sched.finish_requests({rid!r}, RequestStatus.FINISHED_ABORTED)")
            return True
        return super().bad_input(kind, rid) if kind is BadInput.DOUBLE_FREE else False

    def observe(self) -> Observation:
        o = super().observe()
        running = {r.request_id: r for r in self.sched.running}
        return dataclasses.replace(
            o,
            waiting=frozenset(r.request_id for queue in waiting_queues(self.sched) for r in queue),
            tokens={rid: r.num_computed_tokens for rid, r in running.items()},
        )


def waiting_queues(sched: Any) -> list[Any]:
    """Every queue of waiting requests the release has: `waiting`, and `skipped_waiting`
    (0.19 to 0.28 at least: requests a pass skipped) or `kv_holding_waiting` (0.33 at
    least: waiting requests that hold blocks, drained first)."""
    return [sched.waiting, *(getattr(sched, name) for name in ("skipped_waiting", "kv_holding_waiting")
                             if hasattr(sched, name))]
