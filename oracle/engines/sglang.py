"""SGLang's RadixCache with its paged allocator (sglang.srt.mem_cache) behind the adapter
Protocol, driven the way its scheduler does (prefill admission, decode, and the release's
own finishing call), with block = page = 4 tokens and 6 pages. Releases 0.5.5.post3 ..
0.5.23; the preamble gates each API difference on V, the installed release.

admit  = match_prefix, lock the matched node, evict if short, allocate the rest, write
         the request's req_to_token row; refused (match unlocked) when pages are short
grow   = fill the last page, allocate pages for the rest (evicting if short)
finish = 0.5.22+: what release_kv_cache does (checkpoint: insert the page-aligned tokens,
         free duplicate pages; free the unaligned tail, unlock, free the row); before
         0.5.22: the release's own release_kv_cache(req, tree) on a request carrying the
         fields it reads (0.5.21: insert_req, free_kv_row, unpin; 0.5.19 .. 0.5.20 and up
         to 0.5.11: cache_finished_req, which inserts, frees and dec_lock_refs)
evict  = RadixCache.evict(num_tokens) (EvictParams from 0.5.9)

Where releases differ: match_prefix takes MatchPrefixParams from 0.5.8 (a RadixKey
before) and answers a length (device_prefix_len) from 0.5.22 (the slots, device_indices,
before); locks are tree.lock/unlock handles from 0.5.22 (inc_lock_ref/dec_lock_ref on
the node before); the request's KV fields live in req.kv (ReqKvInfo) from 0.5.19 (on the
request before, but for the allocated length, which 0.5.16 .. 0.5.18 keep in a record,
req.kv, that the release drops) and its token ids are arrays from 0.5.19 (lists before);
rows are taken with alloc_rows from 0.5.19 (alloc([req]) in 0.5.9 .. 0.5.18, alloc(1)
before); the
cache is built from CacheInitParams from 0.5.6 (keywords in 0.5.5.post3).

Runs in `.venv-sglang` (`make engines`) or `.venv-hunt/sglang-*`; importing this module
does not import SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from typing import Any

from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted, descendants
from kvoracle.oracle.engines import require_release

PAGE = 4
PAGES = 6

# A module that answers every attribute: what a stand-in module is made of.
ANYTHING = """\
import importlib.abc, importlib.machinery, sys, types


class _Anything:
    def __init__(self, *args, **kwargs): pass
    def __call__(self, *args, **kwargs): return _Anything()
    def __getattr__(self, name): return _Anything()
    def __mro_entries__(self, bases): return (object,)


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Anything()
"""

# The installed SGLang release as a tuple (0.5.5.post3: (0, 5, 5, 3)): what both SGLang
# adapters' preambles gate their differences on.
INSTALLED_RELEASE = """\
from importlib.metadata import version as _version
V = tuple(int(p) if p.isdigit() else 0 for p in _version("sglang").replace(".post", ".").split("."))
"""


def sglang_version() -> tuple[int, ...]:
    """The installed SGLang release as the preambles read it (INSTALLED_RELEASE); () when
    SGLang is not installed."""
    namespace: dict[str, Any] = {}
    try:
        exec(INSTALLED_RELEASE, namespace)
    except PackageNotFoundError:
        return ()
    release: tuple[int, ...] = namespace["V"]
    return release

# Stand-ins for what a CPU machine cannot load and the caches never call (nothing of SGLang
# is replaced): torchvision, which SGLang imports at module level (multimodal preprocessing;
# PyPI's wheel cannot load next to CPU torch), and sgl_kernel's CUDA kernels, which the
# radix cache imports with the host pool in 0.5.6 .. 0.5.10.post1 and HiCache always.
# kvcacheio.transfer_kv_direct, HiCache's host<->device copy (io_backend "direct"), is a
# real CPU index copy. Both SGLang adapters' preambles start with it.
STANDIN = ANYTHING + """
import torch


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    src_indices = src_indices.to("cpu", dtype=torch.int64)
    dst_indices = dst_indices.to("cpu", dtype=torch.int64)
    for s, d in zip(src_layers, dst_layers):
        d[dst_indices] = s[src_indices].to(d.device)


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torchvision", "sgl_kernel"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__, m.__getattr__, m.__version__ = [], _module_getattr, "0.0.0"
        if spec.name == "sgl_kernel.kvcacheio":
            m.transfer_kv_direct = transfer_kv_direct
        return m
    def exec_module(self, module): pass


if not any(type(f).__name__ == "_StandIn" for f in sys.meta_path):  # once per process
    sys.meta_path.insert(0, _StandIn())
"""


def preamble(page: int = PAGE, pages: int = PAGES, rows: int = 8, context: int = 256) -> str:
    """The allocator, request rows and radix cache, and admit (= match, then place),
    grow and finish as the scheduler calls them; the bench builds it at its own size.
    Each difference between releases is gated by V, the installed release."""
    return STANDIN + f"""
from array import array
from types import SimpleNamespace

""" + INSTALLED_RELEASE + f"""

from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

# The params objects came one release apart: match_prefix's in 0.5.8, evict's in 0.5.9 (a bare key and a
# token count before).
if V >= (0, 5, 8):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
if V >= (0, 5, 9):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
if V < (0, 5, 22):  # before tree.checkpoint/tree.unlock: finish is the scheduler's own call, release_kv_cache
    from sglang.srt.managers.schedule_batch import Req as _Req
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    # release_kv_cache and Req's KV-length methods read the published server args
    # (get_global_server_args() up to 0.5.11; from 0.5.19 runtime_context's get_serving()/get_spec())
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size={page}))
if (0, 5, 16) <= V < (0, 5, 22):  # the request's KV bookkeeping moved to a record, req.kv (0.5.16: one field)
    from sglang.srt.managers.schedule_batch import ReqKvInfo

P = {page}
alloc = PagedTokenToKVPoolAllocator({page * pages}, P, torch.float16, "cpu", kvcache=None, need_sort=False)  # pages 1..{pages}
rows = ReqToTokenPool(size={rows}, max_context_len={context}, device="cpu", enable_memory_saver=False)
if V >= (0, 5, 6):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=P))
else:  # 0.5.5.post3 takes its settings as keywords
    tree = RadixCache(req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=P, disable=False)


class Req(SimpleNamespace):  # a request as the release's finishing path reads it (below 0.5.22)
    if V < (0, 5, 16):  # the KV fields are the request's own: req.kv is the request
        kv = property(lambda self: self)

    def is_dllm(self):  # 0.5.9's ReqToTokenPool.alloc asks: a plain request is no diffusion LM's
        return False


# Req's own KV-length methods, borrowed: release_kv_cache asks the request what to keep and free
# (0.5.21: owned_kv_len; 0.5.19, 0.5.20: effective_kv_committed_len; up to 0.5.11:
# pop_committed_kv_cache, which 0.5.10/0.5.11 answer with _cache_commit_len, and pop_overallocated_kv_cache).
for _name in ("owned_kv_len", "effective_kv_committed_len", "_cache_commit_len", "pop_committed_kv_cache",
              "pop_overallocated_kv_cache"):
    if V < (0, 5, 22) and hasattr(_Req, _name):
        setattr(Req, _name, getattr(_Req, _name))


def ids(tokens):  # token ids as the release's Req holds them: arrays from 0.5.19, lists before
    return array("q", tokens) if V >= (0, 5, 19) else list(tokens)


def request(rid, tokens):
    ids_ = ids(tokens)
    if V >= (0, 5, 22):
        kv = SimpleNamespace(req_pool_idx=None, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0)
        return SimpleNamespace(rid=rid, full_untruncated_fill_ids=ids_, origin_input_ids=ids_, extra_key=None,
                               cache_salt=None, priority=None, kv=kv, lock=None, last_node=None)
    req = Req(rid=rid, full_untruncated_fill_ids=ids_, fill_ids=ids_, origin_input_ids=ids_, output_ids=ids(()),
              extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None, skip_radix_cache_insert=False,
              reasoning_tokens=0, prefix_indices=None, last_matched_prefix_len=0)
    if V >= (0, 5, 19):
        req.kv = ReqKvInfo()
    else:
        req.req_pool_idx, req.cache_protected_len, req.mamba_pool_idx = None, 0, None
        req.kv_committed_len = req.kv_allocated_len = 0
        req.kv_committed_freed = req.kv_overallocated_freed = False
        if V >= (0, 5, 16):  # no record until the request holds KV (the release asserts it)
            req.kv = None
    return req


def kv_fields(req):  # where the request's row, protected and committed lengths live
    return req.kv if V >= (0, 5, 19) else req


def holds(req, n):  # before 0.5.22: the KV the row holds, all of it committed (no speculative overallocation)
    kv_fields(req).kv_committed_len = n
    if (0, 5, 16) <= V < (0, 5, 19):  # the allocated length is a record's, made when the KV is
        req.kv = ReqKvInfo(kv_allocated_len=n, swa_evicted_seqlen=0)
    else:
        req.kv.kv_allocated_len = n


def pages_for(req, n):  # n new tokens: the free slots of the last page first, then whole pages
    have = len(req.full_untruncated_fill_ids)
    return max(0, -(-(have + n) // P) - -(-have // P))


def evict(tokens):  # RadixCache.evict; the tokens it freed (0.5.5.post3, 0.5.6 return nothing: counted here)
    if V >= (0, 5, 9):
        return tree.evict(EvictParams(num_tokens=tokens)).num_tokens_evicted
    before = alloc.available_size()
    tree.evict(tokens)
    return alloc.available_size() - before


def room(pages):  # as the scheduler does before allocating: evict the tree for the shortfall
    short = pages * P - alloc.available_size()
    if short > 0:
        evict(short)
    return alloc.available_size() >= pages * P


def match(req):
    if V >= (0, 5, 22):
        m = tree.match_prefix(MatchPrefixParams(key=RadixKey(req.full_untruncated_fill_ids)))
        req.last_node, matched = m.last_device_node, m.device_prefix_len
        req.lock = tree.lock(req.last_node)  # the matched prefix cannot be evicted from here on
        return matched
    key = RadixKey(req.full_untruncated_fill_ids, req.extra_key)
    m = tree.match_prefix(MatchPrefixParams(key=key) if V >= (0, 5, 8) else key)
    req.last_node, req.prefix_indices = m.last_device_node, m.device_indices  # before 0.5.22 the match carries its slots
    req.last_matched_prefix_len = len(req.prefix_indices)
    tree.inc_lock_ref(req.last_node)  # before 0.5.22 a lock is the node's lock_ref; released by dec_lock_ref(last_node)
    req.lock = req.last_node
    return len(req.prefix_indices)


def unlock(req):
    if V >= (0, 5, 22):
        tree.unlock(req.lock)
    else:
        tree.dec_lock_ref(req.last_node)
    req.lock = None


def take_row(req):  # the request's req_to_token row, as the release's scheduler takes it
    if V >= (0, 5, 19):
        req.kv.req_pool_idx = rows.alloc_rows(1)[0]
    elif V >= (0, 5, 9):  # alloc(reqs) sets req.req_pool_idx itself
        rows.alloc([req])
    else:  # up to 0.5.8: alloc(count)
        req.req_pool_idx = rows.alloc(1)[0]
    return kv_fields(req).req_pool_idx


def free_row(req):  # the request's row back, as the release's scheduler gives it
    if V >= (0, 5, 19):
        rows.free_rows([req.kv.req_pool_idx])
    elif V >= (0, 5, 9):  # free(req) clears req.req_pool_idx itself
        rows.free(req)
    else:
        rows.free(req.req_pool_idx)


def place(req, matched):  # None: no room, and the match is unlocked
    new = len(req.full_untruncated_fill_ids) - matched
    if not room(-(-new // P)):
        unlock(req)
        return None
    row = take_row(req)
    kv_fields(req).cache_protected_len = matched
    prefix = tree.path_device_indices(req.last_node)[:matched] if V >= (0, 5, 22) else req.prefix_indices
    rows.write((row, slice(0, matched)), prefix)
    rows.write((row, slice(matched, matched + new)), alloc.alloc(-(-new // P) * P)[:new].to(torch.int32))
    if V < (0, 5, 22):
        holds(req, len(req.full_untruncated_fill_ids))
    return matched


running = {{}}  # the requests placed and not finished, as a scheduler keeps them


def admit(req):
    placed = place(req, match(req))
    if placed is not None:
        running[req.rid] = req
    return placed


def grow(req, tokens):
    have, n = len(req.full_untruncated_fill_ids), len(tokens)
    fresh = pages_for(req, n)
    if not room(fresh):
        return None
    row = kv_fields(req).req_pool_idx
    in_page = min(n, -have % P)
    if in_page:
        last = int(rows.req_to_token[row, have - 1])
        rows.write((row, slice(have, have + in_page)), torch.arange(last + 1, last + 1 + in_page, dtype=torch.int32))
    if fresh:
        rows.write((row, slice(have + in_page, have + n)), alloc.alloc(fresh * P)[: n - in_page].to(torch.int32))
    if V >= (0, 5, 22):
        req.full_untruncated_fill_ids = req.full_untruncated_fill_ids + array("q", tokens)
    else:  # decoded tokens are the request's output; its fill ids are prompt + output
        req.output_ids = req.output_ids + ids(tokens)
        req.full_untruncated_fill_ids = req.fill_ids = req.origin_input_ids + req.output_ids
        holds(req, len(req.full_untruncated_fill_ids))
    return True


def finish(req):
    if V < (0, 5, 22):
        # The release's own finishing call, as its scheduler makes it for a finished request:
        # insert the page-aligned tokens, free the duplicates and the unaligned tail, unlock,
        # free the row (0.5.21: insert_req, free_kv_row, unpin; 0.5.10 .. 0.5.20:
        # cache_finished_req; 0.5.5.post3, 0.5.6: cache_finished_req frees the row too).
        release_kv_cache(req, tree)
        req.lock = None
        running.pop(req.rid, None)
        return
    # what release_kv_cache(req, tree, checkpoint=True) does for a plain request (0.5.22+)
    end = len(req.full_untruncated_fill_ids)
    tree.checkpoint(req, up_to=end)
    alloc.free(rows.req_to_token[req.kv.req_pool_idx, req.kv.cache_protected_len:end].to(torch.int64))
    tree.unlock(req.lock)
    req.lock = None
    free_row(req)
    running.pop(req.rid, None)
"""


PREAMBLE = preamble()

ASSERTIONS = """\
# kvoracle's checks, in SGLang's own terms (pages: slot // P)
from collections import Counter
free = alloc.free_pages.tolist()
nodes, todo = [], list(tree.root_node.children.values())
while todo:
    nodes.append(todo.pop())
    todo.extend(nodes[-1].children.values())
live = [r for r in globals().values() if isinstance(r, SimpleNamespace) and getattr(r, "lock", None) is not None]
tables = {r.rid: {int(s) // P for s in rows.req_to_token[kv_fields(r).req_pool_idx, :len(r.full_untruncated_fill_ids)]} for r in live}
held = Counter(p for t in tables.values() for p in t)
assert len(free) == len(set(free)), f"INV-CONSERVE: free pages {free} list a page twice"
assert set(free) <= set(range(1, alloc.num_pages + 1)), f"INV-CONSERVE: free pages {free} hold ids outside 1..{alloc.num_pages}"
assert len(free) * P <= alloc.size, f"INV-CONSERVE: {len(free) * P} free slots, capacity {alloc.size}"
evictable = {int(s) // P for n in nodes if n.lock_ref == 0 for s in n.value}
assert not set(held) & (set(free) | evictable), f"INV-NO-UAF: pages {sorted(set(held) & (set(free) | evictable))} are held and free or evictable"
for n in nodes:
    for p in {int(s) // P for s in n.value}:
        assert n.lock_ref >= 0, f"INV-REFCOUNT: node {n.id} has lock_ref {n.lock_ref}"
        assert n.lock_ref == held[p], f"INV-REFCOUNT: node {n.id} (page {p}) has lock_ref {n.lock_ref}, held by {held[p]}"
assert alloc.available_size() == P * len(free), f"INV-COUNTERS: available_size {alloc.available_size()}, {len(free)} free pages"
idle = sum(len(n.value) for n in nodes if n.lock_ref == 0)
assert tree.evictable_size_ == idle, f"INV-COUNTERS: evictable_size_ {tree.evictable_size_}, unlocked nodes hold {idle}"
if not live:  # nothing runs: every page is free or evictable
    assert len(set(free) | evictable) == alloc.num_pages, f"LIVE-DRAIN: only {len(set(free) | evictable)} of {alloc.num_pages} pages are free or evictable"
"""


def _row_of(req: Any) -> int:
    """A request's req_to_token row: on its KV record from 0.5.19, on the request before
    (whose record, 0.5.16 .. 0.5.18, holds only the allocated length). Read here, not
    through the preamble, so that a reproduction an older kvoracle wrote still runs."""
    holder = req.kv if hasattr(req.kv, "req_pool_idx") else req
    return int(holder.req_pool_idx)


def _pages(slots: Any) -> tuple[int, ...]:
    """The pages of a run of slot ids, in order, each once."""
    return tuple(dict.fromkeys(int(s) // PAGE for s in slots))


def sglang_release(version: tuple[int, ...]) -> str:
    """A release as SGLang names it: a fourth number is a post release ((0, 5, 5, 3): 0.5.5.post3)."""
    return ".".join(map(str, version[:3])) + "".join(f".post{n}" for n in version[3:])


class SglangAdapter(Scripted):
    name = "sglang"
    block_size = PAGE
    operations = frozenset({Op.ADMIT, Op.GROW, Op.FINISH, Op.EVICT})
    bad_inputs = frozenset({BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.DOUBLE_UNLOCK})
    preamble = PREAMBLE
    assertions = ASSERTIONS
    releases = ((0, 5, 5, 3), (0, 5, 23))  # each difference gated by release in the preamble

    def __init__(self) -> None:
        require_release("sglang", sglang_version(), *self.releases, type(self).__name__, spell=sglang_release)
        super().__init__()

    def bind(self) -> None:
        self.alloc: Any = self.namespace["alloc"]
        self.tree: Any = self.namespace["tree"]
        self.rows: Any = self.namespace["rows"]
        self.live: dict[str, Any] = self.namespace["running"]  # type: ignore[assignment]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        self.run(f"{rid} = request({rid!r}, {list(tokens)})")
        matched = self.run(f"_ = admit({rid})")
        if matched is None:
            raise NoRoom(f"{rid}: no pages")
        return int(matched) // PAGE

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        raise NotImplementedError("Op.PREFILL is not declared: admit places the whole prompt")

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        if self.run(f"_ = grow({rid}, {list(tokens)})") is None:
            raise NoRoom(f"{rid}: no page to grow into")

    def finish(self, rid: str) -> None:
        self.run(f"finish({rid})")

    def evict(self, blocks: int) -> int:
        return int(self.run(f"_ = evict({blocks * PAGE})")) // PAGE  # the tokens freed, in either API

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        free = self.alloc.free_pages.tolist()
        if kind is BadInput.DOUBLE_FREE and free:
            self.run_bad(f"alloc.free(torch.tensor([{free[-1] * PAGE}]))")
        elif kind is BadInput.OUT_OF_RANGE:
            self.run_bad(f"alloc.free(torch.tensor([{(PAGES + 1) * PAGE}]))")
        elif kind is BadInput.DOUBLE_UNLOCK and self._shared_after_finish(rid):
            self.run_bad(f"tree.dec_lock_ref({rid}.last_node)")  # finish unlocked it once already
        else:
            return False
        return True

    def _shared_after_finish(self, rid: str | None) -> bool:
        """rid finished, and another request still locks the node it ended on."""
        req: Any = self.namespace.get(rid) if rid is not None and rid not in self.live else None
        node = None if req is None else req.last_node
        return node is not None and node is not self.tree.root_node and node.lock_ref > 0

    def observe(self) -> Observation:
        nodes = descendants(self.tree.root_node)
        page_of = {p: n for n in nodes for p in _pages(n.value.tolist())}
        row = self.rows.req_to_token
        tables = {
            rid: _pages(row[_row_of(r), : len(r.full_untruncated_fill_ids)].tolist())
            for rid, r in self.live.items()
        }
        idle = [n for n in nodes if n.lock_ref == 0]
        locked = [n for n in nodes if n.lock_ref > 0]
        return Observation(
            ids=range(1, PAGES + 1),
            free=tuple(self.alloc.free_pages.tolist()),
            evictable=tuple(p for p, n in page_of.items() if n.lock_ref == 0),
            tables=tables,
            cached=frozenset(page_of),
            # lock_ref counts the requests whose locked path runs through the node
            refcounts={p: n.lock_ref for p, n in page_of.items()},
            counters={
                "available_size": (self.alloc.available_size(), PAGE * len(self.alloc.free_pages)),
                "evictable_size_": (self.tree.evictable_size_, sum(len(n.value) for n in idle)),
                "protected_size_": (self.tree.protected_size_, sum(len(n.value) for n in locked)),
            },
        )
