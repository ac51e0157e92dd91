"""SGLang's two-tier cache with its storage tier, behind the scheduler Protocol
(oracle.serving): the device pool, the host pool, a storage backend, and the cache
controller with its threads, driven the way SGLang's scheduler drives them.

One adapter for two API generations, chosen from the installed sglang version when the
adapter is built:

- HiRadixCache (0.5.5.post3 .. 0.5.18): HiCacheController, MHATokenToKVPoolHost, with the
  records each release reshaped gated by version (load-back's anchor 0.5.12, write-through
  records 0.5.13, prefetch slots allocated after the storage query 0.5.16, settings read
  from the published server args 0.5.18);
- UnifiedRadixCache with HiCache (0.5.19 .. 0.5.23; from 0.5.19 SGLang's cache registry
  builds no HiRadixCache): HybridCacheController and its host pool group, with SGLang's
  Python tree core (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python: the Rust core's nodes
  cannot be walked, and the checks walk the tree); 0.5.19 and 0.5.20 release a request
  with cache_finished_req (0.5.21: insert_req, free_kv_row, unpin), and 0.5.19 names a
  prefetch by its rid (0.5.20: a CacheRequestHandle).

The storage tier is kvoracle's backend (oracle.engines.sglang_storage) behind SGLang's
HiCacheStorage interface, loaded as SGLang's "dynamic" backend: each call's faults are
what the storage reads and writes answered during the call suffer, in order. A storage
call the controller's threads start during a call without faults (submit's prefetch,
evict_all's backups) waits, parked, for the next call: that call's faults decide it, or
a tick lets it succeed.

The scheduler the adapter plays (the preamble's functions; SGLang's own in brackets):

submit   = queue the request; with storage, match its prompt and prefetch the rest from
           storage [Scheduler._add_request_to_queue, _prefetch_kvcache]
schedule = events [check_hicache_events]; then admit waiting requests in order: skip one
           whose prefetch is still running [check_prefetch_progress], match, lock, load
           host hits back [init_load_back], allocate the rest (evicting first), write the
           req_to_token row; stop at the first that does not fit [PrefillAdder.add_one_req,
           prepare_for_extend]; start the queued load-backs [ready_to_load_host_cache].
           If none was admitted: decode, every running request grows by one token,
           retracting the newest while the pages do not suffice [update_running_batch,
           retract_decode]
finish   = cache_finished_req with insert [release_kv_cache]; abort of a running request
           the same (SGLang finishes it with FINISH_ABORT); abort of a queued request
           drops its prefetch [abort_request, release_aborted_request]
preempt  = release without insert, back to the queue, prefetch again [release_req]
tick(n)  = n scheduler loops with nothing to admit: events and prefetch polls; storage
           answers held LATE arrive when their tick comes
evict_all= evict every device page that can go, then every host page

Determinism: the controller's threads each consume one queue; after every call the
adapter waits until each is blocked on an empty queue or parked in a storage call
(`settle`, reading the threads' frames), and the storage backend lets parked calls go one
at a time, in a fixed order. Nothing sleeps for a fixed time. A controller thread that
dies (SGLang does not restart them) leaves the operation it held in flight for good.

Observations are in pages. Device: the allocator's free pages, the running requests'
req_to_token rows, the pages of tree nodes on the device, each node's lock_ref less the
locks in-flight transfers hold (write-through acks, load-backs: SGLang locks their
paths too), the pages a pending write-through reads (pinned), SGLang's evictable and
protected sizes against their recount, the tree's nodes and the device eviction set
(evictable_leaves from 0.5.9; the FULL LRU list in UnifiedRadixCache). Host: the free
slots (duplicates kept), the host pages of tree nodes, the pages prefetches own and the
pages on their way back to the free list (in flight), the pages storage backups read
(pinned), and the host eviction set (evictable_host_leaves).

Blocks are pages (PAGE tokens). Importing this module does not import SGLang.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle.engine import BadInput, Observation, Scripted, descendants
from kvoracle.oracle.engines.sglang import INSTALLED_RELEASE, STANDIN, sglang_version
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import Status, System
from kvoracle.spec.types import RequestId

PAGE = 8  # tokens per page: SGLang loads host hits back only from 10 tokens on (load_back_threshold)

# SGLang's storage calls run synchronously inside its controller's threads: a read or a
# write either answers (now, or LATE: when the machine's tick comes), fails, half
# succeeds or raises. HANG (a call that never answers) would park a controller thread
# for good, which no storage backend can do to SGLang without also being a dead backend;
# TWICE (a second answer) cannot happen: a call returns once.
STORAGE_FAULTS = frozenset({FaultKind.RAISE, FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})

# cudaHostRegister (page-locking the host pool) does nothing without CUDA, and
# torch.cpu.Stream gets the synchronize() a CUDA stream has (CPU work is synchronous).
STANDINS = STANDIN + """

class _Cudart:
    def cudaHostRegister(self, *args, **kwargs): return 0
    def cudaHostUnregister(self, *args, **kwargs): return 0


if not torch.cuda.is_available():
    torch.cuda.cudart = lambda: _Cudart()
if not hasattr(torch.cpu.Stream, "synchronize"):
    torch.cpu.Stream.synchronize = lambda self: None
"""

COMMON = """\
import atexit, json, logging, os, shutil, tempfile, threading, time
from types import SimpleNamespace

from kvoracle.kvcache.faults import Fault, FaultKind

logging.disable(logging.CRITICAL)  # SGLang logs every failed page; the checks report what matters
DIED, STRANDED = [], []  # controller threads that died (SGLang does not restart them), and the
# operations they held: handed to a thread that will never answer, they stay in flight for good


def _thread_died(a):
    tb = a.exc_traceback
    while tb is not None:
        f = tb.tb_frame.f_locals
        if f.get("self") is globals().get("cc") and f.get("operation") is not None:
            DIED.append(f"{a.thread.name}: {a.exc_value!r}")
            STRANDED.append(f["operation"])
            return
        tb = tb.tb_next


threading.excepthook = _thread_died
""" + INSTALLED_RELEASE + """


def one_process_group():  # SGLang's TP group of size 1, over gloo (the controller asks it its rank)
    from sglang.srt.distributed import parallel_state as ps
    if not torch.distributed.is_initialized():
        rendezvous = tempfile.mkdtemp(prefix="kvoracle-gloo-")  # its store file, gone with the process
        atexit.register(shutil.rmtree, rendezvous, True)
        ps.init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                        distributed_init_method="file://" + os.path.join(rendezvous, "store"))
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
"""

# The scheduler around the cache: the same for both generations, over the API layer
# (match, lock, unlock, load_back, evict, evict_host, release, start_prefetch,
# prefetch_done, drop_prefetch, consumers, ready_to_load) each generation's part defines.
SCHEDULER = """
TOKEN = 9  # every decode step samples this token
REQS, waiting, running = {}, [], []
FREE_ROWS = list(range(rows.size))


class Req:  # the fields of SGLang's Req the cache's request paths read and write
    def __init__(self, rid, tokens):
        self.id, self.rid = rid, f"r{rid}"
        self.origin_input_ids, self.output_ids = ids(tokens), ids(())
        self.state = "waiting"
        self.req_pool_idx, self.last_node, self.lock = None, None, None
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.cache_protected_len = self.filled = 0  # filled: tokens whose KV the row holds
        self.extra_key, self.cache_salt, self.priority, self.is_chunked = None, None, 0, 0
        # read by UnifiedRadixCache's request paths (0.5.21+)
        self.session, self.session_id, self.kv_rotation_base, self.finished_reason = None, None, None, None
        self.swa_host_hit_length = self.mamba_host_hit_length = 0
        self.swa_prefix_lock_released, self.skip_radix_cache_insert = False, False
        self.full_untruncated_fill_ids = None
        self.kv = SimpleNamespace(req_pool_idx=None, cache_protected_len=0, cache_inserted_len=0, kv_allocated_len=0,
                                  kv_committed_len=0, swa_evict_floor=0, mamba_pool_idx=None,
                                  get_evicted_seqlen=lambda ct: 0,
                                  swa_dead_lo=lambda page: 0)
    def finished(self):
        return True
    @property
    def fill_ids(self):
        return self.origin_input_ids + self.output_ids
    def pop_committed_kv_cache(self):
        return self.filled


def blocked_on(t):  # the queue t waits on in Queue.get(), or None
    f, waiting = sys._current_frames().get(t.ident), False
    while f is not None:
        if f.f_code.co_name == "wait":
            waiting = True
        elif f.f_code.co_name == "get" and waiting and hasattr(f.f_locals.get("self"), "not_empty"):
            return f.f_locals["self"]
        f = f.f_back
    return None


def idle(t):  # t waits in get() on an empty queue (checked under the queue's lock)
    q = blocked_on(t)
    if q is None:
        return False
    with q.mutex:
        return not q._qsize() and blocked_on(t) is q


def wait_idle(limit=120.0):  # every controller thread blocked on an empty queue, or parked in storage
    deadline = time.monotonic() + limit
    while True:
        parked = store.plan.parked_threads() if store is not None else set()
        busy = [t.name for t in consumers() if t.is_alive() and t not in parked and not idle(t)]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"SGLang's controller threads {busy} never went idle")
        time.sleep(0.0002)


def settle(decide=True):  # let the threads do all they can; decide the parked storage calls one at a time
    while True:  # (decide=False: the calls stay parked until a call with faults, or a tick, decides them)
        wait_idle()
        if not decide or store is None or store.plan.decide() is None:
            return


def under(faults, call, *args):  # the storage calls made during the call suffer `faults`, in order
    if store is not None:
        store.plan.push(faults)
    try:
        return call(*args)
    finally:
        settle()
        if store is not None:
            store.plan.clear()


def events():  # the top of every scheduler loop
    settle()
    tree.check_hicache_events()
    settle()


def submit(rid, tokens):
    req = REQS[rid] = Req(rid, tokens)
    start_prefetch(req)
    waiting.append(req)
    settle(decide=False)  # submit has no faults: its storage reads answer in the next step
    return req


def admit(req):  # True: it runs; False: no room (nothing of it is held)
    tokens = req.fill_ids
    prefix, last, last_host, hit = match(tokens[: len(tokens) - 1])
    held = lock(last)  # the matched prefix cannot go while the request is placed
    if hit > 0:
        loaded, last = load_back(req, last, last_host, hit)
        prefix = torch.cat([prefix, loaded])
    need = len(tokens) - len(prefix)
    pages = -(-need // P)
    if alloc.available_size() < pages * P:
        evict(pages * P - alloc.available_size())
    slots = alloc.alloc(pages * P) if pages else torch.empty((0,), dtype=torch.int64)
    if slots is None or not FREE_ROWS:
        if slots is not None:
            alloc.free(slots)
        unlock(held)
        return False
    req.lock = lock(last)
    unlock(held)
    req.req_pool_idx = FREE_ROWS.pop(0)
    rows.req_to_token[req.req_pool_idx, : len(prefix)] = prefix.to(torch.int32)
    rows.req_to_token[req.req_pool_idx, len(prefix) : len(tokens)] = slots[:need].to(torch.int32)
    req.prefix_indices, req.cache_protected_len, req.last_node = prefix, len(prefix), last
    req.filled, req.state = len(tokens), "running"
    return True


def decode():  # every running request grows by one token; retract the newest while pages are short
    def short():
        return sum(P for r in running if r.filled % P == 0) - alloc.available_size() - tree.evictable_size()
    while running and short() > 0:
        retract(running[-1])
    for req in list(running):
        row = req.req_pool_idx
        if req.filled % P == 0:
            if alloc.available_size() < P:
                evict(P - alloc.available_size())
            page = alloc.alloc(P)
            if page is None:
                retract(req)
                continue
            slot = int(page[0])
        else:
            slot = int(rows.req_to_token[row, req.filled - 1]) + 1
        rows.req_to_token[row, req.filled] = slot
        req.output_ids.append(TOKEN)
        req.filled += 1


def schedule():
    events()
    admitted = []
    for req in list(waiting):
        if not prefetch_done(req):
            continue  # its prefetch from storage is still running
        if not admit(req):
            break
        waiting.remove(req)
        running.append(req)
        admitted.append(req)
    ready_to_load()  # the prefill batch starts the host->device loads it queued
    if not admitted:
        decode()
    settle()


def free_row(req):
    FREE_ROWS.append(req.req_pool_idx)
    req.req_pool_idx, req.lock, req.last_node = None, None, None


def retract(req):  # release without caching, back to the queue (prefetching again)
    release(req, False)
    running.remove(req)
    req.prefix_indices = torch.empty((0,), dtype=torch.int64)
    req.cache_protected_len = req.filled = 0
    req.state = "preempted"
    start_prefetch(req)
    waiting.append(req)


def finish(batch):
    for rid in batch:
        req = REQS[rid]
        release(req, True)
        running.remove(req)
        req.state = "finished"


def abort(rid):
    req = REQS[rid]
    if req in running:  # finishes with FINISH_ABORT: the finished path
        release(req, True)
        running.remove(req)
    elif req in waiting:
        waiting.remove(req)
        drop_prefetch(req)
    req.state = "aborted"


def preempt(rid):
    retract(REQS[rid])


def tick(n):  # n scheduler loops that admit nothing: events, prefetch polls
    for _ in range(n):
        if store is not None:
            store.plan.now += 1
        events()
        for req in list(waiting):
            prefetch_done(req)
        settle()


def evict_all():  # every device page that can go (to host where backed up), then every host page
    settle(decide=False)
    evict(alloc.size)
    settle(decide=False)
    tree.evict_host(host.size)
    settle(decide=False)
"""

HIRADIX = """
import sglang.srt.mem_cache.memory_pool_host as mph
from sglang.srt.distributed import parallel_state as ps
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey

# The params objects came one release apart: match_prefix's in 0.5.8, evict's in 0.5.9, init_load_back's in 0.5.10.
if V >= (0, 5, 8):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
if V >= (0, 5, 9):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
if V >= (0, 5, 10):
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

mph.SUPPORT_PIN_MEMORY = False  # no cudaHostRegister without CUDA
if V >= (0, 5, 16):  # the MHA host pool moved to pool_host.mha
    import sglang.srt.mem_cache.pool_host.mha as _mha
else:
    _mha = mph
if not hasattr(_mha, "transfer_kv_direct"):  # from 0.5.13 the host pool binds its copy kernel only on GPU builds
    _mha.transfer_kv_direct = transfer_kv_direct
one_process_group()

def stop_event(c):  # what the controller's storage threads loop on (storage_stop_event from 0.5.10)
    return getattr(c, "storage_stop_event", None) or c.stop_event


class Waker(threading.Thread):
    # SGLang's reset() joins the controller's threads while they poll their queues with a
    # one-second timeout (the constructor calls it): wake them with the None their loops
    # skip, so that building an engine does not wait out the poll.
    def __init__(self):
        super().__init__(daemon=True)
        self.done, self.woken = threading.Event(), set()
    def run(self):
        while not self.done.wait(0.0005):
            for t in threading.enumerate():
                target = getattr(t, "_target", None)
                c = getattr(target, "__self__", None)
                if getattr(target, "__name__", "") in ("prefetch_thread_func", "backup_thread_func") \
                        and stop_event(c).is_set() and id(c) not in self.woken:
                    self.woken.add(id(c))
                    c.prefetch_queue.put(None)
                    c.backup_queue.put(None)


waker = Waker()
waker.start()
kv = MHATokenToKVPool(size=P * PAGES, page_size=P, dtype=torch.float16, head_num=1, head_dim=8, layer_num=1,
                      device="cpu", enable_memory_saver=False)
alloc = PagedTokenToKVPoolAllocator(P * PAGES, P, torch.float16, "cpu", kvcache=kv, need_sort=False)
rows = ReqToTokenPool(size=ROWS, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
HICACHE = dict(hicache_ratio=RATIO, hicache_size=0, hicache_write_policy=WRITE_POLICY, hicache_io_backend="direct",
               hicache_mem_layout="layer_first", hicache_storage_backend=BACKEND,
               hicache_storage_backend_extra_config=json.dumps(EXTRA), hicache_storage_prefetch_policy=PREFETCH_POLICY,
               enable_metrics=False)
if V >= (0, 5, 18):  # the cache reads (0.5.18: some of) its settings from the published server args
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    server_args = ServerArgs(model_path="dummy", served_model_name="kvoracle", page_size=P, **HICACHE)
    set_global_server_args_for_scheduler(server_args)
else:
    server_args = SimpleNamespace(served_model_name="kvoracle", extra_metric_labels=None,
                                  disable_hicache_numa_detect=True, **HICACHE)
if V < (0, 5, 6):
    tree = HiRadixCache(
        req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, tp_cache_group=ps.get_tp_group().cpu_group,
        page_size=P, hicache_ratio=RATIO, hicache_size=0, hicache_write_policy=WRITE_POLICY,
        hicache_io_backend="direct", hicache_mem_layout="layer_first", enable_metrics=False,
        hicache_storage_backend=BACKEND, hicache_storage_prefetch_policy=PREFETCH_POLICY,
        model_name="kvoracle", storage_backend_extra_config=json.dumps(EXTRA))
else:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    tree = HiRadixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc,
                                        page_size=P, tp_cache_group=ps.get_tp_group().cpu_group), server_args)
waker.done.set()
cc = tree.cache_controller
host = tree.token_to_kv_pool_host
host.pin_memory = False  # pinned staging pages need CUDA
store = cc.storage_backend if BACKEND else None
IO_THREAD = []  # the prefetch I/O thread: a local of prefetch_thread_func, found by its target


if store is not None:
    store.plan.kinds, store.plan.slow = frozenset(FAULTY), dict(SLOW)


def consumers():  # the controller's threads (each consumes one queue)
    if store is None:
        return []
    # The prefetch I/O thread is a local of prefetch_thread_func; the one a reset() left
    # behind may go on taking from the new buffer too (it reads cc.prefetch_buffer each loop).
    IO_THREAD[:] = [t for t in threading.enumerate() if getattr(t, "_target", None) == cc.prefetch_io_aux_func]
    return [cc.prefetch_thread, cc.backup_thread] + IO_THREAD


def ids(tokens):  # token ids as SGLang's Req holds them
    return list(tokens)


def key(tokens):
    return RadixKey(list(tokens))


def match(tokens):  # (device prefix, last device node, last host node, host hit tokens)
    m = tree.match_prefix(MatchPrefixParams(key=key(tokens)) if V >= (0, 5, 8) else key(tokens))
    MATCHED[0] = m
    return m.device_indices.to(torch.int64), m.last_device_node, m.last_host_node, m.host_hit_length


MATCHED = [None]


def lock(node):
    tree.inc_lock_ref(node)
    return node


def unlock(node):
    tree.dec_lock_ref(node)


def load_back(req, last, last_host, hit):
    if V >= (0, 5, 12):  # the anchor became the match's best_match_node (= last_host_node in HiRadixCache)
        loaded, node = tree.init_load_back(InitLoadBackParams(best_match_node=MATCHED[0].best_match_node,
                                                              host_hit_length=hit))
    elif V >= (0, 5, 10):
        loaded, node = tree.init_load_back(InitLoadBackParams(last_host_node=last_host, host_hit_length=hit))
    else:
        loaded, node = tree.init_load_back(last_host, hit)
    return loaded.to(torch.int64), node


def evict(tokens):
    tree.evict(EvictParams(num_tokens=tokens) if V >= (0, 5, 9) else tokens)


def ready_to_load():
    tree.ready_to_load_host_cache()


def release(req, insert):  # RadixCache.cache_finished_req (is_insert=False: a retraction)
    if V >= (0, 5, 16):  # the KV length to cache became an argument (it was req.pop_committed_kv_cache())
        tree.cache_finished_req(req, is_insert=insert, kv_len_to_handle=req.filled)
    else:
        tree.cache_finished_req(req, is_insert=insert)
    free_row(req)


def start_prefetch(req):  # Scheduler._prefetch_kvcache
    if not PREFETCH:
        return
    tokens = req.fill_ids
    prefix, last, last_host, hit = match(tokens[: len(tokens) - 1])
    if last.backuped:  # only from a backed-up node: device pages without a host copy stay locked otherwise
        matched = len(prefix) + hit
        tree.prefetch_from_storage(req.rid, last_host, tokens[matched:], last_host.get_last_hash_value())


def prefetch_done(req):
    return tree.check_prefetch_progress(req.rid) if PREFETCH else True


def drop_prefetch(req):
    if PREFETCH:
        tree.release_aborted_request(req.rid)


def close():  # stop the controller's threads
    stop_event(cc).set()
    if store is not None:
        store.plan.close()
        cc.prefetch_queue.put(None)
        cc.backup_queue.put(None)


# --- what the checks observe (kvoracle's, in SGLang's terms) ---------------------------------
# 0.5.13 keeps each write-through as (locked node, backup length, the nodes it publishes):
# a split while the write is pending publishes both halves; before, the record was the node.
def writing():  # nodes whose device->host write-through is not acknowledged yet
    if V >= (0, 5, 13):
        return [n for _, _, publish in tree.ongoing_write_through.values() for n in publish]
    return list(tree.ongoing_write_through.values())


def transfer_anchors():  # nodes whose path an in-flight transfer keeps locked (inc_lock_ref)
    out = list(tree.ongoing_load_back.values())
    if WRITE_POLICY != "write_back":
        if V >= (0, 5, 13):
            out += [locked for locked, _, _ in tree.ongoing_write_through.values()]
        else:
            out += list(tree.ongoing_write_through.values())
    return out


def device_leaves():  # the device eviction set (0.5.9+; before, eviction walks the tree)
    return getattr(tree, "evictable_leaves", None)


def host_leaves():
    return getattr(tree, "evictable_host_leaves", None)


def host_free():
    if V >= (0, 5, 16):  # frees wait in release_slots until an alloc merges them
        with host.lock:
            return [int(s) for p in [host.free_slots] + list(host.release_slots) for s in p.tolist()]
    return [int(s) for s in host.free_slots.tolist()]


def prefetch_io():  # prefetch operations whose storage I/O has not ended
    if store is None:
        return []
    buffer = getattr(cc, "prefetch_buffer", None)
    ops = [c.operation for c in store.plan.pending() if c.kind == "read"]
    ops += list(cc.prefetch_queue.queue) + (list(buffer.queue) if buffer is not None else [])
    if V >= (0, 5, 16):  # queried, waiting for the scheduler to allocate its host slots
        ops += list(cc.prefetch_hit_queue.queue)
    return [op for op in ops if op is not None]


def prefetch_op(info):  # an ongoing_prefetch record's operation (0.5.16 dropped its host_indices field)
    return info[2] if V >= (0, 5, 16) else info[3]


def stranded(kind):  # operations of a kind ("read" or "write") a dead controller thread held
    reading = kind == "read"
    return [op for op in STRANDED if hasattr(op, "request_id") == reading]


def host_in_flight():  # host slots prefetches own, and slots on their way back to the free list
    if store is None:
        return []
    busy = prefetch_io()
    ids = {id(op) for op in busy}
    # (0.5.18 dropped the revoke queue: the scheduler revokes a short hit off the hit queue)
    revoked = set(cc.prefetch_revoke_queue.queue) if V < (0, 5, 18) else set()
    # from 0.5.16 a prefetch's host slots are allocated once storage has said how many pages it holds
    out = [int(s) for op in busy if op.host_indices is not None for s in op.host_indices.tolist()]
    for rid, info in tree.ongoing_prefetch.items():
        op = prefetch_op(info)
        if rid not in revoked and id(op) not in ids and op.host_indices is not None:
            out += [int(s) for s in op.host_indices[: op.completed_tokens].tolist()]  # done: it keeps what it read
    for op in stranded("read"):  # its thread died before releasing what it did not read
        out += [int(s) for s in op.host_indices[op.completed_tokens :].tolist()]
    return out + [int(s) for t in list(cc.host_mem_release_queue.queue) for s in t.tolist()]


def host_backing_up():  # host slots storage backups in flight read
    if store is None:
        return []
    ops = list(cc.backup_queue.queue) + [c.operation for c in store.plan.pending() if c.kind == "write"]
    ops += stranded("write")
    return [int(s) for op in ops if op is not None for s in op.host_indices.tolist()]


def in_flight():  # the transfers in flight, by id
    out = [("write-through", i) for i in tree.ongoing_write_through]
    out += [("load-back", i) for i in tree.ongoing_load_back]
    out += [("backup", i) for i in tree.ongoing_backup] + [("prefetch", r) for r in tree.ongoing_prefetch]
    return out + sorted({("prefetch-io", op.id) for op in prefetch_io() + stranded("read")})
"""

UNIFIED = """
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = "python"  # nodes that can be walked
from array import array

from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
if V >= (0, 5, 20):
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
else:  # 0.5.19
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

import sglang.srt.mem_cache.pool_host.mha as _mha  # the host pool binds its copy kernel only on GPU builds
if not hasattr(_mha, "transfer_kv_direct"):
    _mha.transfer_kv_direct = transfer_kv_direct

server_args = ServerArgs(model_path="dummy", page_size=P, hicache_io_backend="direct", hicache_mem_layout="layer_first",
                         hicache_write_policy=WRITE_POLICY, hicache_ratio=RATIO, hicache_storage_backend=BACKEND,
                         hicache_storage_backend_extra_config=json.dumps(EXTRA),
                         hicache_storage_prefetch_policy=PREFETCH_POLICY)
set_global_server_args_for_scheduler(server_args)
if V >= (0, 5, 20):  # (0.5.19 reads the ranks off the process groups below)
    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
if V < (0, 5, 21):  # 0.5.19/0.5.20's controller asks the TP group its rank
    one_process_group()
kv = MHATokenToKVPool(size=P * PAGES, page_size=P, dtype=torch.float16, head_num=1, head_dim=8, layer_num=1,
                      device="cpu", enable_memory_saver=False)
alloc = PagedTokenToKVPoolAllocator(P * PAGES, P, torch.float16, "cpu", kvcache=kv, need_sort=False)
rows = ReqToTokenPool(size=ROWS, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
params = CacheInitParams(req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=P, disable=False,
                         tree_components=(ComponentType.FULL,))
tree = UnifiedRadixCache(params=params)
tree.init_hicache(server_args, params)
cc = tree.cache_controller
host = cc.mem_pool_host.anchor_entry.host_pool  # the FULL KV host pool of the pool group
for entry in cc.mem_pool_host.entries:
    entry.host_pool.pin_memory = False  # pinned staging pages need CUDA
store = cc.storage_backend if BACKEND else None
if store is not None:
    store.plan.kinds, store.plan.slow = frozenset(FAULTY), dict(SLOW)
core = tree.tree_core
FULL = ComponentType.FULL


def consumers():  # the controller's threads (each consumes one queue)
    if store is None:
        return []
    return [t for t in (cc.prefetch_thread, cc.prefetch_io_aux_thread, cc.prefetch_sync_thread, cc.backup_thread)
            if t is not None]


def ids(tokens):  # token ids as SGLang's Req holds them
    return array("q", tokens)


def key(tokens):
    return RadixKey(array("q", tokens))


def match(tokens):  # (device prefix, last device node, last host node, host hit tokens)
    m = tree.match_prefix(MatchPrefixParams(key=key(tokens)))
    if hasattr(m, "device_prefix_len"):  # 0.5.22+: a length; the indices are read off the path
        prefix = tree.path_device_indices(m.last_device_node)[: m.device_prefix_len]
    else:
        prefix = m.device_indices
    MATCHED[0] = m
    return prefix.to(torch.int64), m.last_device_node, m.last_host_node, m.host_hit_length


MATCHED = [None]


def lock(node):
    if hasattr(tree, "lock"):  # 0.5.22+: a TreeLock (checkpoint moves it)
        return tree.lock(node)
    return (node, tree.inc_lock_ref(node).to_dec_params())


def unlock(held):
    if hasattr(tree, "unlock"):
        tree.unlock(held)
    else:
        tree.dec_lock_ref(*held)


def load_back(req, last, last_host, hit):
    req.last_node = last
    got = tree.init_load_back(InitLoadBackParams(best_match_node=MATCHED[0].best_match_node, host_hit_length=hit,
                                                 req=req))
    loaded, node = got if got is not None else (0, last)
    if isinstance(loaded, int):  # a count: the indices are read off the path
        have = len(tree.path_device_indices(last))
        loaded = tree.path_device_indices(node)[have : have + loaded]
    return loaded.to(torch.int64), node


def evict(tokens):
    tree.evict(EvictParams(num_tokens=tokens))


def ready_to_load():
    tree.ready_to_load_host_cache()


def release(req, insert):  # release_kv_cache: keep what the tree can key, free the row, unlock
    req.kv.req_pool_idx, req.kv.cache_protected_len = req.req_pool_idx, req.cache_protected_len
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.filled
    req.full_untruncated_fill_ids = req.fill_ids
    if hasattr(tree, "checkpoint"):  # 0.5.22+
        if insert:
            tree.checkpoint(req, up_to=req.filled)
        tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, req.filled)])
        tree.unlock(req.lock)
    elif V >= (0, 5, 21):
        req.lock_receipt = req.lock[1]
        if insert:
            tree.insert_req(req, up_to=req.filled)
        tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, req.filled)])
        tree.unpin(req)
    else:  # 0.5.19, 0.5.20: one call inserts, frees the row's rest and unlocks
        if V >= (0, 5, 20):
            req.lock_receipt = req.lock[1]
        else:  # 0.5.19 keeps the receipt's two fields on the request
            receipt = req.lock[1]
            req.swa_uuid_for_lock, req.skip_lock_node_ids = receipt.swa_uuid_for_lock, receipt.skip_lock_node_ids
        req.kv.swa_evicted_seqlen = 0  # its row free splits at the SWA floor; full attention only: none
        tree.cache_finished_req(req, is_insert=insert, kv_len_to_handle=req.filled)
    free_row(req)


def handle(req):  # how the prefetch calls name a request (its rid in 0.5.19)
    if V < (0, 5, 20):
        return req.rid
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    return CacheRequestHandle(rid=req.rid, attempt_id=0)


def start_prefetch(req):  # Scheduler._prefetch_kvcache
    if not PREFETCH:
        return
    tokens = req.fill_ids
    prefix, last, last_host, hit = match(tokens[: len(tokens) - 1])
    if tree.is_backuped(last_host) or tree.is_root(last_host):
        matched = len(prefix) + hit
        tree.prefetch_from_storage(handle(req), last_host, tokens[matched : len(tokens) - 1],
                                   tree.get_last_hash_value(last_host), matched_prefix_tokens=tokens[:matched])


def prefetch_done(req):
    return tree.check_prefetch_progress(handle(req)) if PREFETCH else True


def drop_prefetch(req):
    if PREFETCH:
        tree.release_aborted_request(handle(req))


def close():  # stop the controller's threads
    if store is not None:
        cc.storage_stop_event.set()
        store.plan.close()
        for q in (cc.prefetch_queue, cc.prefetch_buffer, cc.prefetch_sync_queue, cc.backup_queue):
            q.put(None)


# --- what the checks observe (kvoracle's, in SGLang's terms) ---------------------------------
def node(i):
    return core.node_by_id(i)


def writing():  # nodes whose device->host write-through is not acknowledged yet
    return [node(i) for w in tree.ongoing_write_through.values() for i in w.publish_node_ids]


def transfer_anchors():  # nodes whose path an in-flight transfer keeps locked
    out = [node(w.node_id) for w in tree.ongoing_write_through.values() if w.lock_params is not None]
    return out + [node(b.node_id) for b in tree.ongoing_load_back.values()]


def lru_nodes(lru):
    out, n = [], lru.head.lru_next[lru._pt]
    while n is not None and n is not lru.tail:
        if n is not lru.cursor:
            out.append(n)
        n = n.lru_next[lru._pt]
    return out


def device_leaves():  # what device eviction walks: the FULL component's LRU list
    return lru_nodes(core.lru_lists[FULL])


def host_leaves():
    return core.evictable_host_leaves


def host_free():
    with host.lock:
        parts = [host.free_slots] + list(getattr(host, "release_slots", []))
        return [int(s) for p in parts for s in p.tolist()]


def prefetch_io():  # prefetch operations whose storage I/O or final acknowledgement is pending
    if store is None:
        return []
    ops = [c.operation for c in store.plan.pending() if c.kind == "read"] + list(cc.prefetch_buffer.queue)
    ops += [a.operation for a in list(cc.prefetch_sync_queue.queue) + list(cc.ack_prefetch_queue.queue)
            if a is not None and a.completed_req]
    ops += [op for op in STRANDED if hasattr(op, "request_id")]  # its last acknowledgement never comes
    return [op for op in ops if op is not None]


def host_in_flight():  # host slots prefetches own, and slots on their way back to the free list
    if store is None:
        return []
    current = {id(info.operation) for info in tree.ongoing_prefetch.values()}
    out = [int(s) for info in tree.ongoing_prefetch.values() if info.host_indices is not None
           for s in info.host_indices.tolist()]
    seen = set()
    for op in prefetch_io():  # ended for the scheduler; the tail it did not read comes back with its last ack
        if id(op) not in current and id(op) not in seen and op.host_indices is not None:
            seen.add(id(op))
            out += [int(s) for s in op.host_indices[op.completed_tokens :].tolist()]
    return out + [int(s) for t in list(cc.host_mem_release_queue.queue) if t is not None for s in t.tolist()]


def host_backing_up():  # host slots storage backups in flight read
    if store is None:
        return []
    ops = list(cc.backup_queue.queue) + [c.operation for c in store.plan.pending() if c.kind == "write"]
    ops += [op for op in STRANDED if not hasattr(op, "request_id")]
    return [int(s) for op in ops if op is not None for s in op.host_indices.tolist()]


def in_flight():  # the transfers in flight, by id
    out = [("write-through", i) for i in tree.ongoing_write_through]
    out += [("load-back", i) for i in tree.ongoing_load_back]
    out += [("backup", i) for i in tree.ongoing_backup]
    out += [("prefetch", h if V < (0, 5, 20) else h.rid) for h in tree.ongoing_prefetch]  # keyed by rid in 0.5.19
    return out + sorted({("prefetch-io", op.id) for op in prefetch_io()})
"""


def _pages(slots: Iterable[int], page: int) -> tuple[int, ...]:
    """The pages of a run of slots, in order, each once."""
    return tuple(dict.fromkeys(int(s) // page for s in slots))


def _names(nodes: Any) -> frozenset[str] | None:
    return None if nodes is None else frozenset(str(n.id) for n in list(nodes))


def _slots(t: Any) -> list[int]:
    return [] if t is None else [int(x) for x in t.tolist()]


_LIVE: list[weakref.ref[Any]] = []  # the engine built last: its threads stop when the next is built

_STATUS = {"waiting": Status.WAITING, "running": Status.RUNNING, "preempted": Status.PREEMPTED,
           "finished": Status.FINISHED, "aborted": Status.ABORTED}


class SglangHiCache(Scripted):
    """SGLang 0.5.23's UnifiedRadixCache with HiCache (0.5.19 .. 0.5.23; HiRadixCache in
    0.5.5.post3 .. 0.5.18) with everything on: write-through to host, storage backups,
    prefetch from storage, every storage fault the engine can meet."""

    name = "sglang-hicache"
    block_size = PAGE  # tokens per page (= block)
    gpu_blocks = 8  # device pages
    cpu_blocks = 0  # host pages: set from the host pool when built
    host_ratio = 2.0  # host pool size / device pool size (SGLang's hicache_ratio)
    timeout = 10  # ticks; longer than the longest LATE delay the machine draws (6)
    write_policy = "write_through"
    storage = True
    prefetch = True
    prefetch_policy = "best_effort"
    fault_kinds: frozenset[FaultKind] = STORAGE_FAULTS
    faulty_calls: tuple[str, ...] = ("read", "write")  # the storage calls that suffer the step's faults
    slow: Mapping[str, int] = {}  # "read"/"write" -> ticks every such call takes when no fault is drawn
    # SGLang refuses none of the scheduler-level bad calls with an exception of its own
    # (its allocators accept double frees; its scheduler filters unknown ids silently).
    refusals: Mapping[BadInput, type[Exception]] = {}

    def __init__(self) -> None:
        for ref in _LIVE:  # one engine at a time: the previous one's threads stop
            old = ref()
            if old is not None:
                old.close()
        _LIVE[:] = []
        self.v = sglang_version()
        if (0, 5, 5, 3) <= self.v < (0, 5, 19):  # from 0.5.19 SGLang builds HiCache as UnifiedRadixCache only
            self.generation = "hiradix"
        elif (0, 5, 19) <= self.v < (0, 5, 24):
            self.generation = "unified"
        else:
            raise RuntimeError(f"sglang {'.'.join(map(str, self.v)) or 'is not installed'}: this adapter drives "
                               "0.5.5.post3 .. 0.5.18 (HiRadixCache) and 0.5.19 .. 0.5.23 (UnifiedRadixCache)")
        self.preamble = self.build_preamble()
        super().__init__()
        _LIVE.append(weakref.ref(self))

    def build_preamble(self) -> str:
        extra: dict[str, object] = {"prefetch_threshold": self.block_size if self.prefetch else 1 << 30}
        if self.storage:
            extra.update(backend_name="kvoracle", module_path="kvoracle.oracle.engines.sglang_storage",
                         class_name="KvoracleStorage")
        settings = (f"P, PAGES, ROWS, CONTEXT = {self.block_size}, {self.gpu_blocks}, 16, 512\n"
                    f"RATIO, WRITE_POLICY = {self.host_ratio!r}, {self.write_policy!r}\n"
                    f"BACKEND, PREFETCH = {'dynamic' if self.storage else None!r}, {self.storage and self.prefetch}\n"
                    f"PREFETCH_POLICY, EXTRA = {self.prefetch_policy!r}, {json.dumps(extra)}\n"
                    f"FAULTY = {sorted(self.faulty_calls)!r}  # the storage calls that take the step's faults\n"
                    f"SLOW = {self.slow!r}  # ticks every storage call of a kind takes\n")
        part = HIRADIX if self.generation == "hiradix" else UNIFIED
        return STANDINS + COMMON + settings + part + SCHEDULER

    def bind(self) -> None:
        ns = self.namespace
        self.tree: Any = ns["tree"]
        self.cc: Any = ns["cc"]
        self.alloc: Any = ns["alloc"]
        self.rows: Any = ns["rows"]
        host: Any = ns["host"]
        self.host = host
        self.store: Any = ns["store"]
        self.reqs: dict[int, Any] = ns["REQS"]  # type: ignore[assignment]
        self.generation = "hiradix" if "IO_THREAD" in ns else "unified"
        self.host_pages = self.cpu_blocks = int(host.size) // self.block_size

    def close(self) -> None:
        try:
            self.namespace["close"]()  # type: ignore[operator]
        except Exception:
            pass

    # --- operations -----------------------------------------------------------------------

    def _under(self, faults: Sequence[Fault], call: str) -> None:
        self.run(f"under({list(faults)!r}, {call})")

    def submit(self, r: RequestId, tokens: Sequence[int]) -> None:
        self.run(f"submit({int(r)}, {list(tokens)})")

    def schedule(self, faults: Sequence[Fault]) -> None:
        self._under(faults, "schedule")

    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None:
        self._under(faults, f"finish, {[int(r) for r in batch]}")

    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, f"preempt, {int(r)}")

    def abort(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, f"abort, {int(r)}")

    def tick(self, n: int) -> None:
        self.run(f"tick({n})")

    def evict_all(self) -> None:
        self.run("evict_all()")

    def bad_call(self, kind: BadInput) -> bool:
        return False

    # --- what the machine asks -------------------------------------------------------------

    def statuses(self) -> dict[RequestId, Status]:
        return {RequestId(rid): _STATUS[req.state] for rid, req in self.reqs.items()}

    def running(self) -> list[RequestId]:
        return [RequestId(req.id) for req in self.namespace["running"]]  # type: ignore[attr-defined]

    def waiting(self) -> list[RequestId]:
        return [RequestId(req.id) for req in self.namespace["waiting"]]  # type: ignore[attr-defined]

    def faults_injected(self) -> int:
        return 0 if self.store is None else int(self.store.plan.injected)

    def outcomes(self) -> dict[str, int]:
        """How the storage calls ended, by call and fault kind ("write ok", "read error")."""
        ended: dict[str, int] = {}
        for kind, _, fault in [] if self.store is None else list(self.store.plan.log):
            key = f"{kind} {fault.split('(')[0]}"
            ended[key] = ended.get(key, 0) + 1
        return ended

    def state(self) -> System | None:
        return None  # SGLang's tiers are not exclusive (a node is on device and host at once)

    def events(self) -> list[Event] | None:
        return None

    def invariants(self) -> list[Violation]:
        return []  # the machine evaluates spec's predicates on the observations

    def content(self) -> list[Violation]:
        return []

    def snapshot(self) -> object:
        o, c = self.observe(), self.observe_cpu()
        return o.free, o.tables, o.cached, c.free, c.cached, self.statuses()

    # --- the tree --------------------------------------------------------------------------

    def _nodes(self) -> list[Any]:
        if self.generation == "hiradix":
            return descendants(self.tree.root_node)
        core = self.tree.tree_core
        return descendants(core.node_by_id(self.tree.root_node_handle()))

    def _value(self, n: Any) -> Any:
        return n.value if self.generation == "hiradix" else n.component(self._full).value

    def _host_value(self, n: Any) -> Any:
        return n.host_value if self.generation == "hiradix" else n.component(self._full).host_value

    def _lock_ref(self, n: Any) -> int:
        return int(n.lock_ref if self.generation == "hiradix" else n.component(self._full).lock_ref)

    @property
    def _full(self) -> Any:
        return self.namespace["ComponentType"].FULL  # type: ignore[attr-defined]

    def _transfer_locks(self) -> Counter[int]:
        """Lock refs that in-flight transfers (write-through acks, load-backs) hold on each
        node and its ancestors: the rest is the requests' (SGLang locks paths)."""
        held: Counter[int] = Counter()
        anchors = self.namespace["transfer_anchors"]()  # type: ignore[operator]
        for n in anchors:
            while n is not None and n.parent is not None:
                held[id(n)] += 1
                n = n.parent
        return held

    # --- observations ----------------------------------------------------------------------

    def transfers(self) -> list[object]:
        return list(self.namespace["in_flight"]())  # type: ignore[operator]

    def observe(self) -> Observation:
        ns = self.namespace
        nodes = self._nodes()
        on_device = [n for n in nodes if self._value(n) is not None]
        owner: dict[int, Any] = {}
        for n in on_device:
            for p in _pages(_slots(self._value(n)), self.block_size):
                owner.setdefault(p, n)
        locks = self._transfer_locks()
        running = list(ns["running"])  # type: ignore[call-overload]
        tables = {req.rid: _pages(_slots(self.rows.req_to_token[req.req_pool_idx, : req.filled]), self.block_size)
                  for req in running}
        free = _slots(self.alloc.free_pages) + _slots(getattr(self.alloc, "release_pages", None))
        idle = [n for n in on_device if self._lock_ref(n) == 0]
        held = [n for n in on_device if self._lock_ref(n) > 0]
        pinned = {p for n in ns["writing"]() for p in _pages(_slots(self._value(n)), self.block_size)}  # type: ignore[operator]
        counters = {
            "available_size": (int(self.alloc.available_size()), self.block_size * len(free)),
            "evictable_size": (int(self.tree.evictable_size()), sum(len(self._value(n)) for n in idle)),
        }
        if self.generation == "hiradix":
            counters["protected_size"] = (int(self.tree.protected_size()), sum(len(self._value(n)) for n in held))
        return Observation(
            ids=range(1, self.gpu_blocks + 1),
            free=tuple(free),
            evictable=tuple(p for p, n in owner.items() if self._lock_ref(n) == 0),
            tables=tables,
            cached=frozenset(owner),
            refcounts={p: self._lock_ref(n) - locks[id(n)] for p, n in owner.items()},
            counters=counters,
            waiting=frozenset(req.rid for req in ns["waiting"]),  # type: ignore[attr-defined]
            tokens={req.rid: int(req.filled) for req in running},
            pinned=frozenset(pinned),
            in_flight=(),
            nodes=frozenset(str(n.id) for n in nodes),
            findable=_names(ns["device_leaves"]()),  # type: ignore[operator]
        )

    def observe_cpu(self) -> Observation:
        ns = self.namespace
        nodes = self._nodes()
        cached = {p for n in nodes for p in _pages(_slots(self._host_value(n)), self.block_size)}
        free = [s // self.block_size for s in ns["host_free"]() if s % self.block_size == 0]  # type: ignore[operator]
        owned = {s // self.block_size for s in ns["host_in_flight"]()}  # type: ignore[operator]
        reading = {s // self.block_size for s in ns["host_backing_up"]()}  # type: ignore[operator]
        return Observation(
            ids=range(self.host_pages),
            free=tuple(free),
            cached=frozenset(cached),
            in_flight=tuple(sorted(owned)),
            pinned=frozenset(reading),
            nodes=frozenset(str(n.id) for n in nodes),
            findable=_names(ns["host_leaves"]()),  # type: ignore[operator]
        )


# --- the hunt's rows: each steers the campaign to one known bug's path, and away from the
# other bugs its fixed version still has ------------------------------------------------------

_QUIET_FAULTS = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})  # no RAISE: it kills threads (#38428)


class PrefetchDoubleRelease(SglangHiCache):
    """SGLang #13483 / PR #13501 (buggy 0.5.2 .. 0.5.5.post3, fixed 0.5.6): a prefetch from
    storage that ends early releases its unused host slots twice (_page_transfer and
    prefetch_io_aux_func). Storage reads fail, half succeed or answer late; writes always
    succeed at once, and the host pool is large, so that the backup-gap bug 0.5.6 still
    has (a backup that cannot find host room) stays away; nothing raises (0.5.6's
    controller threads die on storage exceptions)."""

    name = "sglang-prefetch-double-release"
    fault_kinds = _QUIET_FAULTS
    faulty_calls = ("read",)
    host_ratio = 2.0


class BackupGapOrphan(SglangHiCache):
    """The backup gap (buggy up to 0.5.10.post1, fixed 0.5.11; public thread: PR #22062):
    with the host pool full of pages storage backups still read, write_backup of a parent
    fails silently while its child is backed up; device eviction then deletes the parent
    and orphans the child's host pages. A small host pool and storage writes that answer
    late; no prefetch, nothing raises."""

    name = "sglang-backup-gap-orphan"
    # Long prompts (half a page a token): a 6-page prompt whose slow backups fill the host
    # pool, a 5-page prefix that then finds no host room, and that prefix with one more
    # page, whose backup does.
    prompts = ((1,) * 12, (2,) * 10, (2,) * 10 + (1, 1))
    fault_kinds = frozenset({FaultKind.LATE})
    faulty_calls = ("write",)
    slow = {"write": 2}
    timeout = 40  # backups queue behind slow writes
    host_ratio = 1.13
    prefetch = False


class HostLeafStatus(SglangHiCache):
    """SGLang #19212 / PR #23537 (buggy 0.5.9 .. 0.5.10.post1, fixed 0.5.11): under the
    write_back policy, the host-leaf status checks `child.evicted` instead of
    `child.backuped`, so host eviction deletes a parent whose child still has host pages.
    write_back, a small host pool, no storage tier."""

    name = "sglang-host-leaf-status"
    write_policy = "write_back"
    storage = False
    fault_kinds = frozenset()
    host_ratio = 1.5


class BackupThreadDies(SglangHiCache):
    """SGLang #38428 (buggy up to 0.5.21, fixed 0.5.22): a storage write that raises kills
    the controller's backup thread; its backup, and every later one, is never
    acknowledged. Storage writes raise; no prefetch."""

    name = "sglang-backup-thread-dies"
    fault_kinds = frozenset({FaultKind.RAISE})
    faulty_calls = ("write",)
    prefetch = False


class PrefetchThreadDies(SglangHiCache):
    """The prefetch I/O thread dies on a storage read that raises (buggy up to 0.5.21,
    fixed 0.5.22; described in PR #36882, the #38428 family): the prefetch in flight, and
    every later one, never completes. Storage reads raise; writes succeed; requests wait
    for their prefetch (wait_complete); small pools, so that prompts find pages in storage
    only (UnifiedRadixCache prefetches only up to the last prompt token's page)."""

    name = "sglang-prefetch-thread-dies"
    fault_kinds = frozenset({FaultKind.RAISE})
    faulty_calls = ("read",)
    prefetch_policy = "wait_complete"
    gpu_blocks = 4  # small pools: pages leave the host, so prompts find them in storage only
    host_ratio = 1.25
    # three 3-page prompts with nothing in common push each other out of both pools, so a
    # prompt that comes back finds its pages in storage only
    prompts = ((1,) * 6, (2,) * 6, (3,) * 6)


class PrefetchStaleAck(SglangHiCache):
    """SGLang PR #39318 (buggy 0.5.19, fixed 0.5.20): UnifiedRadixCache matches a prefetch's
    acknowledgements to the request by its rid alone, so the last ack of a prefetch that
    ended early (best_effort) and arrives after the request was retracted and prefetches
    again is taken for the new prefetch: the new prefetch's host slots go into the tree
    before they are read, and the old prefetch's slots are never freed. Storage faults
    that do not raise (0.5.19's controller threads die on those that do, #38428)."""

    name = "sglang-prefetch-stale-ack"
    fault_kinds = _QUIET_FAULTS
