# kvoracle reproduction: fastdeploy-tiered, INV-COUNTERS
# found by: admit(budget=0, chunk=1, cold=0, p=0, prefill=False, then=None) ; admit(budget=0, chunk=0, cold=0, p=0, prefill=False, then=None) ; prefill(chunk=1, i=0, then_commit=False)
# after allocate:
#   INV-COUNTERS: node_id_pool reported 6, the structures hold 7
#   INV-COUNTERS: node_map reported 3, the structures hold 2
#   INV-COUNTERS: node_map in tree reported 2, the structures hold 3
# Run it in the engine's environment (kvoracle installed); it fails with the ID above while the
# engine has the bug.

from types import SimpleNamespace

import numpy as np
from fastdeploy.cache_manager.prefix_cache_manager import PrefixCacheManager

BLOCK = 2
cache_config = SimpleNamespace(
    total_block_num=6, prefill_kvcache_block_num=6, num_cpu_blocks=3, kvcache_storage_backend=None,
    write_policy="write_through", bytes_per_token_per_layer=1, enable_prefix_caching=True,
    enable_output_caching=False, block_size=BLOCK,
)
config = SimpleNamespace(cache_config=cache_config, speculative_config=None,
                         parallel_config=SimpleNamespace(tensor_parallel_size=1))
pcm = PrefixCacheManager(config, tensor_parallel_size=1)  # no launch_cache_manager: no processes, no IPC
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

from kvoracle.oracle.findings import Last, fails_with, view_now

# the engine calls of the shrunk program
r0 = request('r0', [1, 1, 2, 2, 1])
_ = match(r0)
_ = allocate(r0, 1)
r1 = request('r1', [1, 1, 2, 2, 1])
_ = match(r1)
_ = allocate(r1, 2)
with Last() as _last:  # the call after which the check fired (what it raises is judged)
    _ = allocate(r0, 1)

# kvoracle's check that fired, on the state the calls above left (generated)
fails_with('INV-COUNTERS', 'kvoracle.oracle.engines.fastdeploy_tiered:FastDeployTiered', globals(), live={'r0': 2, 'r1': 6}, raised=_last.error)
