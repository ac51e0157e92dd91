# kvoracle reproduction: vllm, INV-REFCOUNT
# found by: bad_input(i=0, kind=BadInput.DOUBLE_FREE)
# after bad_input:double_free:
#   INV-REFCOUNT: blocks [1] have a negative reference count
# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the
# engine has the bug.

from contextlib import suppress
import os
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM first looks for a platform
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher(4, sha256)
layer = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16)
config = KVCacheConfig(num_blocks=7, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], layer)])


def request(rid, tokens):
    return Request(rid, tokens, SamplingParams(max_tokens=256), None, block_hasher=hasher)

from vllm.v1.core.kv_cache_manager import KVCacheManager

mgr = KVCacheManager(config, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
pool = mgr.block_pool


def match(req):
    hit, hit_tokens, _ = mgr.get_computed_blocks(req)
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
        del req.block_hashes[req.num_tokens // 4:]
    else:
        req.num_computed_tokens = req.num_tokens
    return got

# the engine calls of the shrunk program
with suppress(Exception):  # a bad call, accepted
    pool.free_blocks([pool.blocks[1]])

# kvoracle's check that fired, on the state the calls above left (generated)
from kvoracle.oracle.findings import fails_with, view_now
fails_with('INV-REFCOUNT', 'kvoracle.oracle.engines.vllm:VllmAdapter', globals(), live={})

# the adapter's own checks, in the engine's terms
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
