# kvoracle reproduction: fastdeploy-chunked, INV-COUNTERS
# found by: admit(chunks=1, p=2) ; admit(chunks=0, p=2) ; prefill(blocks=1, i=0)
# after prefill:
#   INV-COUNTERS: node_id_pool reported 3, the structures hold 4
#   INV-COUNTERS: node_map reported 3, the structures hold 2
# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the
# engine has the bug.

from types import SimpleNamespace

import numpy as np
from fastdeploy.cache_manager.prefix_cache_manager import PrefixCacheManager

BLOCK = 4
cache_config = SimpleNamespace(
    total_block_num=6, prefill_kvcache_block_num=6, num_cpu_blocks=0, kvcache_storage_backend=None,
    write_policy="write_through", bytes_per_token_per_layer=1, enable_prefix_caching=True,
    enable_output_caching=False, block_size=BLOCK,
)
config = SimpleNamespace(cache_config=cache_config, speculative_config=None,
                         parallel_config=SimpleNamespace(tensor_parallel_size=1))
pcm = PrefixCacheManager(config, tensor_parallel_size=1)  # no launch_cache_manager: no processes, no IPC
# launch_cache_manager is what creates prefix_tree_status_signal (an IPC signal). The manager's
# error handlers read it to decide whether to re-raise, so without it any engine exception
# would surface as an AttributeError. 0 is PrefixTreeStatus.NORMAL: errors are re-raised.
pcm.prefix_tree_status_signal = SimpleNamespace(value=np.array([0]))
running = {}  # request id -> request, as ResourceManagerV1.running


def request(rid, tokens):
    # the fields of fastdeploy.engine.request.Request that the manager and the scheduler's
    # prefix-cache path read and write (a text-only request)
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(tokens), output_token_ids=[],
                           multimodal_inputs=None, need_prefill_tokens=len(tokens), num_computed_tokens=0,
                           num_cached_tokens=0, block_tables=[], num_cached_blocks=0)


def free_blocks(req):  # ResourceManagerV1._free_blocks with prefix caching
    pcm.release_block_ids(req)
    pcm.recycle_gpu_blocks(req.block_tables[req.num_cached_blocks:], req.request_id)
    req.block_tables = []


def admit(req):  # the scheduler's WAITING path; None: no room, the request keeps waiting
    common, matched, _ = pcm.request_match_blocks(req, BLOCK)
    req.block_tables = common
    req.num_cached_tokens = matched
    # on a full hit the scheduler recomputes the last block (in place: no new block)
    req.num_computed_tokens = matched - BLOCK if matched == req.need_prefill_tokens else matched
    new_tokens = req.need_prefill_tokens - req.num_computed_tokens
    new_blocks = (req.num_computed_tokens + new_tokens + BLOCK - 1) // BLOCK - len(req.block_tables)
    if not pcm.can_allocate_gpu_blocks(new_blocks):  # may evict
        free_blocks(req)
        return None
    if new_blocks > 0:
        req.block_tables.extend(pcm.allocate_gpu_blocks(new_blocks, req.request_id))
    req.num_computed_tokens += new_tokens
    pcm.update_cache_blocks(req, BLOCK, req.num_computed_tokens)
    running[req.request_id] = req
    return matched


def grow(req, tokens):  # decode growth; None: no room (the scheduler would preempt instead)
    req.output_token_ids.extend(tokens)
    total = len(req.prompt_token_ids) + len(req.output_token_ids)
    need = (total + BLOCK - 1) // BLOCK - len(req.block_tables)
    if need > 0:
        if not pcm.can_allocate_gpu_blocks(need):  # may evict
            del req.output_token_ids[-len(tokens):]
            return None
        req.block_tables.extend(pcm.allocate_gpu_blocks(need, req.request_id))
    req.num_computed_tokens = total
    return req.block_tables


def finish(req):  # ResourceManagerV1.finish_requests
    running.pop(req.request_id, None)
    free_blocks(req)


def evict(n):
    before = len(pcm.gpu_free_block_list)
    pcm.free_block_ids(n)
    return len(pcm.gpu_free_block_list) - before


def prefill(req, tokens):  # the next chunk of a RUNNING request; None: no room (it would preempt)
    req.prompt_token_ids.extend(tokens)  # the machine reveals the prompt chunk by chunk
    req.need_prefill_tokens += len(tokens)
    new_tokens = req.need_prefill_tokens - req.num_computed_tokens
    new_blocks = (req.num_computed_tokens + new_tokens + BLOCK - 1) // BLOCK - len(req.block_tables)
    if not pcm.can_allocate_gpu_blocks(new_blocks):  # may evict
        del req.prompt_token_ids[-len(tokens):]
        req.need_prefill_tokens -= len(tokens)
        return None
    req.block_tables.extend(pcm.allocate_gpu_blocks(new_blocks, req.request_id))
    req.num_computed_tokens += new_tokens
    pcm.update_cache_blocks(req, BLOCK, req.num_computed_tokens)
    return req.block_tables

from kvoracle.oracle.findings import Last, fails_with, view_now

# the engine calls of the shrunk program
r0 = request('r0', [1, 1, 1, 1])
_ = admit(r0)
r1 = request('r1', [1, 1, 1, 1, 2, 2, 1, 1])
_ = admit(r1)
with Last() as _last:  # the call after which the check fired (what it raises is judged)
    _ = prefill(r0, [2, 2, 1, 1])

# kvoracle's check that fired, on the state the calls above left (generated)
fails_with('INV-COUNTERS', 'kvoracle.oracle.engines.fastdeploy_chunked:FastDeployChunked', globals(), live={'r0': 8, 'r1': 8}, raised=_last.error)

# the adapter's own checks, in the engine's terms
# kvoracle's checks, in FastDeploy's own terms
from collections import Counter
free = list(pcm.gpu_free_block_list)
held = Counter(b for req in running.values() for b in set(req.block_tables))
nodes, todo = [], list(pcm.radix_tree_root.children.values())
while todo:
    nodes.append(todo.pop())
    todo.extend(nodes[-1].children.values())
nodes = [n for n in nodes if n.has_in_gpu]
in_tree = {n.block_id for n in nodes} | {b for n in nodes for b in n.reverved_dec_block_ids}


def reachable(n):  # free_block_ids can evict n: an LRU-heap leaf, or a node whose children all are
    kids = [reachable(c) for c in n.children.values()]
    return n.shared_count == 0 and not n.is_persistent and (all(kids) if kids else n in pcm.gpu_lru_leaf_set)


evictable = {n.block_id for n in nodes if reachable(n)}
assert len(free) == len(set(free)), f"INV-CONSERVE: gpu_free_block_list {sorted(free)} lists a block twice"
assert set(free) <= set(range(pcm.num_gpu_blocks)), f"INV-CONSERVE: gpu_free_block_list {sorted(free)} holds ids outside 0..{pcm.num_gpu_blocks - 1}"
lost = set(range(pcm.num_gpu_blocks)) - set(free) - set(held) - in_tree
assert not lost, f"INV-CONSERVE: blocks {sorted(lost)} are neither free, nor held by a running request, nor in the radix tree"
for rid, req in running.items():
    need = -(-(len(req.prompt_token_ids) + len(req.output_token_ids)) // BLOCK)
    assert len(req.block_tables) >= need, f"INV-REQUEST: {rid} has {len(req.block_tables)} blocks for {need} blocks of tokens"
assert not set(held) & (set(free) | evictable), f"INV-NO-UAF: blocks {sorted(set(held) & (set(free) | evictable))} are held and free or evictable"
shared = sorted(b for b, n in held.items() if n > 1 and b not in in_tree)
assert not shared, f"INV-NO-UAF: blocks {shared} are in two requests' block_tables but not in the radix tree"
for n in nodes:
    assert n.shared_count >= 0, f"INV-REFCOUNT: node {n.node_id} (block {n.block_id}) has shared_count {n.shared_count}"
    assert n.shared_count == held[n.block_id], f"INV-REFCOUNT: node {n.node_id} (block {n.block_id}) has shared_count {n.shared_count}, held by {held[n.block_id]}"
assert len(pcm.node_map) == len(nodes), f"INV-COUNTERS: node_map has {len(pcm.node_map)} nodes, the radix tree {len(nodes)}"
assert len(pcm.req_leaf_map) == len(running), f"INV-COUNTERS: req_leaf_map tracks {len(pcm.req_leaf_map)} requests, {len(running)} are running"
if not running:  # nothing runs: every block is free or reclaimable by eviction
    assert len(set(free) | evictable) == pcm.num_gpu_blocks, f"LIVE-DRAIN: only {len(set(free) | evictable)} of {pcm.num_gpu_blocks} blocks are free or evictable"
