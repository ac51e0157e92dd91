"""FastDeploy's PrefixCacheManager with its CPU tier (num_cpu_blocks > 0) behind the
tiered-cache Protocol (oracle.tiered), swapping through FastDeploy's own code:

match     = request_match_blocks, as ResourceManagerV1.get_prefix_cached_blocks calls it:
            GPU hits are shared, CPU hits are swapped in (SWAP2GPU) before it returns
allocate  = allocate_gpu_blocks for the request's next chunk (or a decode block)
commit    = update_cache_blocks with the tokens of the full blocks computed so far
release   = ResourceManagerV1._free_blocks (release_block_ids, then recycle_gpu_blocks of the
            private tail); no storage tier, so no write is started
evict_gpu = free_block_ids without its wait (free_block_ids_async): LRU leaves are dropped
            when more blocks are asked for than the CPU tier has (its direct-free branch),
            else marked SWAP2CPU and swapped out by its eviction executor thread
evict_cpu = free_cpu_block_ids
complete  = the transfer process's answer: the manager's receiver (recv_data_transfer_result,
            run until it has taken every answer) finishes the swap, and the eviction that
            waited for it ends
reset     = clear_prefix_cache's CLEARING path: the transfers in flight end first

Transfers go through a stand-in of FastDeploy's IPC task queue (the preamble's
TransferQueue), which records each swap task. FastDeploy waits synchronously for every
swap. A swap-in waits inside request_match_blocks, under request_release_lock, which every
other cache call takes, so nothing can happen before it ends: the queue answers it at
once. A swap-out waits in the eviction executor, holding no lock: it stays in flight until
the machine completes it, and only with Ok (FastDeploy's transfer process reports no
failure: transfer_outcomes). Meanwhile FastDeploy evicts nothing more (free_block_ids_async
returns while the previous swap-out runs), so the GPU observation lists no evictable block.

abstract() is None: FastDeploy keys nodes by its own token hashes and has SWAP2CPU and
SWAP2GPU states that spec/ lacks. Eviction steps name nodes by their node_id. Importing
this module does not import FastDeploy.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from kvoracle.oracle.engine import NOBODY, BadInput, Observation, Scripted, descendants
from kvoracle.oracle.engines.fastdeploy import REQUESTS, construction
from kvoracle.oracle.tiered import Blocks, Matched, Pending
from kvoracle.spec.actions import Drop, EvictCpu, EvictStep, SwapOutTo
from kvoracle.spec.invariants import Violation
from kvoracle.spec.state import CacheState
from kvoracle.spec.types import BlockHash, CpuBlock, GpuBlock, Ok, Outcome, RequestId, TransferId

BLOCK = 2
GPU_BLOCKS = 6
CPU_BLOCKS = 3

PREAMBLE = construction(GPU_BLOCKS, CPU_BLOCKS, BLOCK) + '''\
import threading
from concurrent.futures import wait

from fastdeploy.cache_manager.cache_data import CacheStatus
from fastdeploy.inter_communicator import PrefixTreeStatus
from fastdeploy.utils import get_hash_str


class Drained(BaseException):  # ends the receiver loop once it has taken every answer
    pass


class TransferQueue:
    """Stands in for EngineCacheQueue, the IPC queue to the cache transfer processes: it
    records each swap task; a swap-in is answered at once, a swap-out when completed."""

    def __init__(self):
        self.pending = {}  # transfer -> the task, as put_transfer_task got it
        self.answers = []  # done signals, as the transfer process sends them back
        self.issued = 0
        self.changed = threading.Condition()

    def put_transfer_task(self, task):
        with self.changed:
            self.pending[self.issued] = task
            self.issued += 1
            self.changed.notify_all()
        if task[0] == CacheStatus.SWAP2GPU:  # request_match_blocks waits for it, holding its lock
            complete(self.issued - 1)

    def answer(self, t):
        self.answers.append(self.pending.pop(t))
        return self.answers[-1]

    def get_transfer_done_signal(self):
        if not self.answers:
            raise Drained
        return self.answers.pop(0)

    def result_queue_empty(self):
        return not self.answers

    def wake(self, *_):
        with self.changed:
            self.changed.notify_all()


class TreeStatus:
    """Stands in for the prefix_tree_status IPC signal: NORMAL while this program runs and
    until closed (a swap-out left in flight then stops waiting)."""

    def __init__(self):
        self.value = self
        self.closed = False

    def __getitem__(self, i):
        on = not self.closed and not threading._SHUTTING_DOWN  # the interpreter joins the executors
        return PrefixTreeStatus.NORMAL if on else PrefixTreeStatus.CLEARED

    def close(self):
        self.closed = True


queue = pcm.cache_task_queue = TransferQueue()
status = pcm.prefix_tree_status_signal = TreeStatus()
pcm.cache_task_inflight_signal = SimpleNamespace(value=np.zeros([1]))  # read by reset
running = {}  # request id -> request, as ResourceManagerV1.running
''' + REQUESTS + '''

def match(req):  # ResourceManagerV1.get_prefix_cached_blocks
    common, matched, _ = pcm.request_match_blocks(req, BLOCK)
    req.block_tables = list(common)
    req.num_cached_tokens = matched
    running[req.request_id] = req
    return req.block_tables


def allocate(req, n):  # ResourceManagerV1.schedule, one chunk (or a decode block)
    blocks = pcm.allocate_gpu_blocks(n, req.request_id)
    req.block_tables.extend(blocks)
    commit(req)  # as the scheduler does right after allocating
    return blocks


def commit(req):  # update_cache_blocks: the prompt's full blocks the table covers join the tree
    req.num_computed_tokens = min(len(req.block_tables) * BLOCK, len(req.prompt_token_ids))
    pcm.update_cache_blocks(req, BLOCK, req.num_computed_tokens)


def release(req):  # finish, abort or preempt: the blocks go back, no storage write
    running.pop(req.request_id, None)
    free_blocks(req)


def evict(n):  # free_block_ids without its wait: the swap-out it starts stays in flight
    issued, running_before = queue.issued, pcm.gpu_free_task_future
    pcm.free_block_ids_async(n)  # returns at once while an earlier swap-out runs
    future = pcm.gpu_free_task_future
    if future is not None and future is not running_before:  # until the executor waits for its swap-out
        future.add_done_callback(queue.wake)
        with queue.changed:
            queue.changed.wait_for(lambda: future.done() or queue.issued > issued)


def complete(t):  # the transfer process answers: the manager's receiver takes the answer
    task = queue.answer(t)
    try:
        pcm.recv_data_transfer_result()
    except Drained:
        pass
    if task[0] == CacheStatus.SWAP2CPU:  # the eviction executor's wait ends with it
        wait([pcm.gpu_free_task_future])


def reset():  # clear_prefix_cache, CLEARING: the transfers in flight end, then the tree goes
    for t in list(queue.pending):
        complete(t)
    pcm.reset(wait_for_tasks_done=True)
'''


class FastDeployTiered(Scripted):
    """PrefixCacheManager with 6 GPU and 3 CPU blocks of 2 tokens."""

    name = "fastdeploy-tiered"
    block_size = BLOCK
    gpu_blocks = GPU_BLOCKS
    cpu_blocks = CPU_BLOCKS
    transfer_outcomes = frozenset({"ok"})
    match_limits = False  # request_match_blocks swaps in every CPU hit
    # What FastDeploy refuses, with what (it accepts a free block freed again, an id past
    # the pool or of the other tier, a request id in use, a reset with requests live).
    refusals: Mapping[BadInput, type[Exception]] = {
        BadInput.DOUBLE_FINISH: KeyError,  # release_block_ids: req_leaf_map.pop
        BadInput.UNKNOWN_REQUEST: KeyError,  # update_cache_blocks: req_to_radix_tree_info
        BadInput.TOO_MANY: AssertionError,  # allocate_gpu_blocks
    }
    preamble = PREAMBLE

    def __init__(self) -> None:
        super().__init__()
        weakref.finalize(self, self.status.close)  # a swap-out left in flight stops waiting

    def bind(self) -> None:
        self.pcm: Any = self.namespace["pcm"]
        self.queue: Any = self.namespace["queue"]
        self.status: Any = self.namespace["status"]
        self.running: Any = self.namespace["running"]
        self.hash_block: Any = self.namespace["get_hash_str"]
        self.states: Any = self.namespace["CacheStatus"]

    # --- what a scheduler asks --------------------------------------------------------

    def free_gpu(self) -> int:
        return len(self.pcm.gpu_free_block_list)

    def gpu_hits(self, prompt: Blocks) -> int:
        """mm_match_block's walk, without its effects: leading blocks on the GPU."""
        node, key, hits = self.pcm.radix_tree_root, list[str](), 0
        for i in range(len(prompt.tokens) // BLOCK):
            h = self.hash_block(list(prompt.tokens[i * BLOCK:(i + 1) * BLOCK]), key)
            node = node.children.get(h)
            if node is None or node.cache_status not in (self.states.GPU, self.states.SWAP2CPU):
                break
            hits, key = hits + 1, [h]
        return hits

    def ready(self, r: RequestId) -> bool:
        return True  # a swap-in ends inside match

    def table(self, r: RequestId) -> tuple[GpuBlock, ...]:
        return tuple(GpuBlock(b) for b in self.running[f"r{r}"].block_tables)

    def in_flight(self) -> list[Pending]:
        return [Pending(TransferId(t), len(task[3])) for t, task in sorted(self.queue.pending.items())]

    def cached(self) -> int:
        return len(descendants(self.pcm.radix_tree_root))

    # --- operations ---------------------------------------------------------------------

    def match(self, r: RequestId, prompt: Blocks, limit: int) -> Matched:
        self.run(f"r{r} = request('r{r}', {list(prompt.tokens)})")
        self.run(f"_ = match(r{r})")
        return Matched()

    def allocate(self, r: RequestId, n: int) -> tuple[GpuBlock, ...]:
        return tuple(GpuBlock(b) for b in self.run(f"_ = allocate(r{r}, {n})"))

    def commit(self, r: RequestId, full: Blocks) -> None:
        self.run(f"commit(r{r})")  # allocate inserted them already: a no-op, as in FastDeploy

    def release(self, r: RequestId, write: Blocks) -> tuple[tuple[BlockHash, GpuBlock], ...]:
        self.run(f"release(r{r})")
        return ()

    def evict_gpu(self, n: int) -> tuple[EvictStep, ...]:
        return self._evicting(f"evict({n})")

    def evict_cpu(self, n: int) -> tuple[EvictStep, ...]:
        return self._evicting(f"_ = pcm.free_cpu_block_ids({n})")

    def complete(self, t: TransferId, outcome: Outcome) -> None:
        if not isinstance(outcome, Ok):
            raise ValueError(f"FastDeploy's swaps end only ok (transfer_outcomes), not {outcome!r}")
        self.run(f"complete({t})")

    def reset(self) -> None:
        self.run("reset()")

    def bad_call(self, kind: BadInput, r: RequestId | None) -> bool:
        calls: dict[BadInput, str] = {
            BadInput.UNKNOWN_REQUEST: f"pcm.update_cache_blocks(request('r{NOBODY}', []), BLOCK, 0)"}
        if r is not None:
            calls[BadInput.DOUBLE_FINISH] = f"release(r{r})"
            calls[BadInput.TOO_MANY] = f"pcm.allocate_gpu_blocks(len(pcm.gpu_free_block_list) + 1, 'r{r}')"
        if kind not in calls:
            return False
        self.run_bad(calls[kind])
        return True

    def _evicting(self, call: str) -> tuple[EvictStep, ...]:
        """Run an eviction; its steps, from the tree and node_map before and after it."""
        before = {n: n.cache_status for n in descendants(self.pcm.radix_tree_root)}
        self.run(call)
        after = {n: n.cache_status for n in descendants(self.pcm.radix_tree_root)}
        dest = {node: cpu for task in self.queue.pending.values() for node, cpu in zip(task[2], task[4])}
        steps: list[EvictStep] = []
        for n, was in before.items():
            name, now = BlockHash(n.node_id), after.get(n)
            if now is None and self.pcm.node_map.get(n.node_id) is not n:  # evicted (else only detached)
                steps.append(EvictCpu(name) if was is self.states.CPU else Drop(name))
            elif was is self.states.GPU and now is self.states.SWAP2CPU:
                steps.append(SwapOutTo(name, CpuBlock(dest.get(n.node_id, -1))))
        return tuple(steps)

    # --- what the machine checks --------------------------------------------------------

    def observe(self) -> Observation:
        pcm, tree = self.pcm, descendants(self.pcm.radix_tree_root)
        linked = set(map(id, tree))
        on_gpu = [n for n in tree if n.cache_status in (self.states.GPU, self.states.SWAP2CPU)]
        swapping = self.queue.pending.values()
        return Observation(
            ids=range(pcm.num_gpu_blocks),
            free=tuple(pcm.gpu_free_block_list),
            # none while a swap-out runs: FastDeploy evicts nothing more until it ends
            evictable=() if swapping else tuple(n.block_id for n in on_gpu if self._reachable(n, True)),
            tables={rid: tuple(req.block_tables) for rid, req in self.running.items()},
            cached=frozenset(n.block_id for n in on_gpu) | {b for n in on_gpu for b in n.reverved_dec_block_ids},
            refcounts={n.block_id: n.shared_count for n in on_gpu},
            counters={
                "node_map": (len(pcm.node_map), len(tree)),
                "node_id_pool": (len(pcm.node_id_pool), pcm.num_gpu_blocks + pcm.num_cpu_blocks - len(tree)),
                "node_id_pool distinct": (len(set(pcm.node_id_pool)), len(pcm.node_id_pool)),
                "node_map in tree": (sum(1 for n in pcm.node_map.values() if id(n) in linked), len(pcm.node_map)),
                "gpu_lru_leaf_heap": (len(pcm.gpu_lru_leaf_heap), len(pcm.gpu_lru_leaf_set)),
                "gpu_lru_leaf_heap in leaf set": (sum(1 for n in pcm.gpu_lru_leaf_heap if n in pcm.gpu_lru_leaf_set),
                                                  len(pcm.gpu_lru_leaf_heap)),
                "req_leaf_map": (len(pcm.req_leaf_map), len(self.running)),
                "req_to_radix_tree_info": (len(pcm.req_to_radix_tree_info), len(self.running)),
            },
            pinned=frozenset(g for task in swapping for g in task[3]),  # swap-out sources
            nodes=frozenset(map(self._name, tree)),
            findable=frozenset(map(self._name, pcm.gpu_lru_leaf_set)),
        )

    def observe_cpu(self) -> Observation:
        pcm, tree = self.pcm, descendants(self.pcm.radix_tree_root)
        on_cpu = [n for n in tree if n.cache_status in (self.states.CPU, self.states.SWAP2GPU)]
        return Observation(
            ids=range(pcm.num_cpu_blocks),
            free=tuple(pcm.cpu_free_block_list),
            evictable=tuple(n.block_id for n in on_cpu if self._reachable(n, False)),
            tables={},
            cached=frozenset(n.block_id for n in on_cpu),
            counters={"cpu_lru_leaf_heap": (len(pcm.cpu_lru_leaf_heap), len(pcm.cpu_lru_leaf_set)),
                      "cpu_lru_leaf_heap in leaf set": (sum(1 for n in pcm.cpu_lru_leaf_heap if n in pcm.cpu_lru_leaf_set),
                                                        len(pcm.cpu_lru_leaf_heap))},
            pinned=frozenset(),
            in_flight=tuple(c for task in self.queue.pending.values() for c in task[4]),  # swap-out destinations
            nodes=frozenset(map(self._name, tree)),
            findable=frozenset(map(self._name, pcm.cpu_lru_leaf_set)),
        )

    def snapshot(self) -> object:
        pcm, name = self.pcm, self._name
        tree = descendants(pcm.radix_tree_root)
        return (
            tuple(pcm.gpu_free_block_list), tuple(pcm.cpu_free_block_list), tuple(pcm.node_id_pool),
            tuple((name(n), name(n.parent), n.hash_value, n.block_id, n.cache_status, n.shared_count,
                   tuple(n.reverved_dec_block_ids), tuple(sorted(n.req_id_set))) for n in tree),
            tuple(sorted(pcm.node_map)),
            tuple(name(n) for n in pcm.gpu_lru_leaf_heap), tuple(sorted(map(name, pcm.gpu_lru_leaf_set))),
            tuple(name(n) for n in pcm.cpu_lru_leaf_heap), tuple(sorted(map(name, pcm.cpu_lru_leaf_set))),
            tuple(sorted((rid, name(n)) for rid, n in pcm.req_leaf_map.items())),
            tuple(sorted((name(n), tuple(sorted(rids))) for n, rids in pcm.leaf_req_map.items())),
            tuple(sorted((rid, name(v[0]), v[1]) for rid, v in pcm.req_to_radix_tree_info.items())),
            tuple(sorted((rid, tuple(b)) for rid, b in pcm.unfilled_req_block_map.items())),
            tuple(sorted((rid, tuple(req.block_tables)) for rid, req in self.running.items())),
            tuple(sorted(self.queue.pending)),
        )

    def abstract(self) -> CacheState | None:
        return None

    def invariants(self) -> list[Violation]:
        """None of its own: FastDeploy's structures (node_map, node_id_pool, the LRU heaps
        and their leaf sets) are compared with its tree through the observations' kept
        counters, which spec/ judges (INV-COUNTERS), as every property is judged."""
        return []

    def _name(self, n: Any) -> str:
        """A node by its node_id; a node that node_map does not hold under it is marked."""
        if n is self.pcm.radix_tree_root:
            return "root"
        return f"{n.node_id}" + ("" if self.pcm.node_map.get(n.node_id) is n else " (not in node_map)")

    def _reachable(self, n: Any, gpu: bool) -> bool:
        """Eviction of that tier can take n on demand: a leaf its heap holds, or a node
        whose children it can all take first (a child on the other tier stops the cascade)."""
        pcm = self.pcm
        tier, kept = (self.states.GPU, pcm.gpu_lru_leaf_set) if gpu else (self.states.CPU, pcm.cpu_lru_leaf_set)
        if n.cache_status is not tier or n.shared_count != 0 or n.is_persistent:
            return False
        kids = list(n.children.values())
        if not kids:
            return n in kept
        leaf = n.is_gpu_leaf_node if gpu else n.is_cpu_leaf_node
        return (n in kept and bool(leaf)) or all(self._reachable(c, gpu) for c in kids)
