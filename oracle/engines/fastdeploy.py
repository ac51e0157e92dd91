"""FastDeploy's PrefixCacheManager (fastdeploy.cache_manager.prefix_cache_manager) behind
the adapter Protocol, driven the way ResourceManagerV1 (fastdeploy/engine/sched/
resource_manager_v1.py) drives it with prefix caching on, no CPU tier and no storage:

admit  = request_match_blocks; block_tables = the matched blocks; can_allocate_gpu_blocks
         (which may evict) for the rest; allocate_gpu_blocks; update_cache_blocks for the
         whole prompt (the scheduler inserts the prompt's full blocks when it schedules
         them). Refused: the match is undone as ResourceManagerV1._free_blocks undoes it.
grow   = decode growth: append the output tokens and allocate a block when they need one
         (no tree insert: output caching is off, as by default)
finish = ResourceManagerV1._free_blocks: release_block_ids (unlocks the radix-tree path),
         then recycle_gpu_blocks of the request's private tail block_tables[num_cached_blocks:]
evict  = free_block_ids(n): LRU eviction of up to n unreferenced tree leaves (synchronous
         without a CPU tier)

The block table lives on the request in FastDeploy (the scheduler owns it), so the
preamble keeps `running`, ResourceManagerV1's running requests, next to the manager.
FastDeploy is not on PyPI: install it from source with PaddlePaddle (docs/engines.md).
Importing this module does not import FastDeploy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted, descendants

BLOCK = 4
NUM_BLOCKS = 6  # GPU blocks 0..5; FastDeploy has no reserved null block


def construction(gpu_blocks: int, cpu_blocks: int, block: int = BLOCK) -> str:
    """The preamble's first part: the manager, built from a minimal config."""
    return f"""\
from types import SimpleNamespace

import numpy as np
from fastdeploy.cache_manager.prefix_cache_manager import PrefixCacheManager

BLOCK = {block}
cache_config = SimpleNamespace(
    total_block_num={gpu_blocks}, prefill_kvcache_block_num={gpu_blocks}, num_cpu_blocks={cpu_blocks}, kvcache_storage_backend=None,
    write_policy="write_through", bytes_per_token_per_layer=1, enable_prefix_caching=True,
    enable_output_caching=False, block_size=BLOCK,
)
config = SimpleNamespace(cache_config=cache_config, speculative_config=None,
                         parallel_config=SimpleNamespace(tensor_parallel_size=1))
pcm = PrefixCacheManager(config, tensor_parallel_size=1)  # no launch_cache_manager: no processes, no IPC
"""


# The requests, as the scheduler keeps them, and its release path (shared with the adapters
# of chunked prefill and of the CPU tier).
REQUESTS = """\


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
"""

PREAMBLE = construction(NUM_BLOCKS, 0) + """\
# launch_cache_manager is what creates prefix_tree_status_signal (an IPC signal). The manager's
# error handlers read it to decide whether to re-raise, so without it any engine exception
# would surface as an AttributeError. 0 is PrefixTreeStatus.NORMAL: errors are re-raised.
pcm.prefix_tree_status_signal = SimpleNamespace(value=np.array([0]))
running = {}  # request id -> request, as ResourceManagerV1.running
""" + REQUESTS + """\


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
"""

# The order follows oracle.engine.check, so that a reproduction fails with the ID the
# campaign reported first.
ASSERTIONS = """\
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
"""


class FastDeployAdapter(Scripted):
    name = "fastdeploy"
    block_size = BLOCK
    operations = frozenset({Op.ADMIT, Op.GROW, Op.FINISH, Op.EVICT})
    bad_inputs = frozenset({BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.DOUBLE_FINISH})
    preamble = PREAMBLE
    assertions = ASSERTIONS

    def bind(self) -> None:
        self.pcm: Any = self.namespace["pcm"]
        self.running: Any = self.namespace["running"]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        self.run(f"{rid} = request({rid!r}, {list(tokens)})")
        matched = self.run(f"_ = admit({rid})")
        if matched is None:
            raise NoRoom(f"can_allocate_gpu_blocks refused {rid}")
        assert isinstance(matched, int)
        return matched // BLOCK

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        raise NotImplementedError("Op.PREFILL is not declared: admit places the whole prompt")

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        if self.run(f"_ = grow({rid}, {list(tokens)})") is None:
            raise NoRoom(f"can_allocate_gpu_blocks refused growing {rid}")

    def finish(self, rid: str) -> None:
        self.run(f"finish({rid})")

    def evict(self, blocks: int) -> int:
        freed = self.run(f"_ = evict({blocks})")
        assert isinstance(freed, int)
        return freed

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        if kind is BadInput.DOUBLE_FREE:
            free = self.pcm.gpu_free_block_list
            if not free:
                return False
            self.run_bad(f"pcm.recycle_gpu_blocks([{free[0]}])")  # a block that is already free
            return True
        if kind is BadInput.OUT_OF_RANGE:
            self.run_bad(f"pcm.recycle_gpu_blocks([{NUM_BLOCKS}])")
            return True
        if kind is BadInput.DOUBLE_FINISH and rid is not None and rid in self.namespace and rid not in self.running:
            self.run_bad(f"finish({rid})")  # release_block_ids raises KeyError: a refusal
            return True
        return False

    def observe(self) -> Observation:
        pcm = self.pcm
        nodes = [n for n in descendants(pcm.radix_tree_root) if n.has_in_gpu]
        return Observation(
            ids=range(pcm.num_gpu_blocks),
            # a heapq min-heap; cached blocks stay owned by their tree nodes until evicted
            free=tuple(pcm.gpu_free_block_list),
            # Not simply "shared_count == 0": a node is reclaimable only if free_block_ids can
            # reach it, i.e. it is on the LRU leaf heap, or all its children are reachable
            # (eviction cascades to a parent that becomes a free leaf). A node with
            # shared_count 0 that eviction cannot reach is stranded: it stays in `cached`
            # and LIVE-DRAIN reports it.
            evictable=tuple(n.block_id for n in nodes if _reachable(n, pcm.gpu_lru_leaf_set)),
            tables={rid: tuple(req.block_tables) for rid, req in self.running.items()},
            # the tree as a match walks it, from the root through `children`; a node's
            # reserved decode blocks are owned by it too (none here: v1 caches full blocks only)
            cached=frozenset({n.block_id for n in nodes} | {b for n in nodes for b in n.reverved_dec_block_ids}),
            # shared_count: +1 on each node of a request's matched path, 1 for each node the
            # request adds, -1 on its whole path at release. So it counts the running requests
            # whose block_tables hold the node's block, which is what INV-REFCOUNT checks.
            refcounts={n.block_id: n.shared_count for n in nodes},
            counters={
                "node_map": (len(pcm.node_map), len(nodes)),
                "node_id_pool": (len(pcm.node_id_pool), pcm.num_gpu_blocks + pcm.num_cpu_blocks - len(nodes)),
                "gpu_lru_leaf_heap": (len(pcm.gpu_lru_leaf_heap), len(pcm.gpu_lru_leaf_set)),
                "req_leaf_map": (len(pcm.req_leaf_map), len(self.running)),
                "req_to_radix_tree_info": (len(pcm.req_to_radix_tree_info), len(self.running)),
            },
        )


def _reachable(node: Any, heap: Any) -> bool:
    kids = [_reachable(c, heap) for c in node.children.values()]
    if node.shared_count != 0 or node.is_persistent:
        return False
    return all(kids) if kids else node in heap
