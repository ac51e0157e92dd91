"""SGLang 0.5.23's RadixCache with its paged allocator (sglang.srt.mem_cache) behind the
adapter Protocol, driven the way its scheduler does (prefill admission, decode, and
`release_kv_cache` at finish), with block = page = 4 tokens and 6 pages.

admit  = match_prefix, lock the matched node, evict if short, allocate the rest, write
         the request's req_to_token row; refused (match unlocked) when pages are short
grow   = fill the last page, allocate pages for the rest (evicting if short)
finish = checkpoint (insert the page-aligned tokens, free duplicate pages), free the
         unaligned tail, unlock, free the row
evict  = RadixCache.evict(num_tokens)

Runs in `.venv-sglang` (`make engines`); importing this module does not import SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoracle.oracle.engine import BadInput, NoRoom, Observation, Op, Scripted, descendants
from kvoracle.oracle.engines import require_release

PAGE = 4
PAGES = 6

# A module that answers every attribute: what a stand-in module is made of (the deep
# adapter, sglang_hicache, builds its own stand-ins from it too).
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

# SGLang imports torchvision at module level (multimodal preprocessing); PyPI's torchvision
# cannot load next to CPU torch, and the radix cache never calls it: a stand-in module.
TORCHVISION_STANDIN = ANYTHING + """

class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # sglang.srt.configs imports torchvision at module level (multimodal preprocessing);
    # PyPI's torchvision cannot load next to CPU torch, and the radix cache never uses it.
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] == "torchvision" else None
    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__, m.__getattr__, m.__version__ = [], _module_getattr, "0.0.0"
        return m
    def exec_module(self, module): pass


sys.meta_path.insert(0, _TorchvisionStandIn())
"""


def preamble(page: int = PAGE, pages: int = PAGES, rows: int = 8, context: int = 256) -> str:
    """The allocator, request rows and radix cache, and admit (= match, then place),
    grow and finish as the scheduler calls them; the bench builds it at its own size."""
    return TORCHVISION_STANDIN + f"""
from array import array
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

P = {page}
alloc = PagedTokenToKVPoolAllocator({page * pages}, P, torch.float16, "cpu", kvcache=None, need_sort=False)  # pages 1..{pages}
rows = ReqToTokenPool(size={rows}, max_context_len={context}, device="cpu", enable_memory_saver=False)
tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc, page_size=P))


def request(rid, tokens):
    ids = array("q", tokens)
    kv = SimpleNamespace(req_pool_idx=None, cache_protected_len=0, cache_inserted_len=0, swa_evict_floor=0)
    return SimpleNamespace(rid=rid, full_untruncated_fill_ids=ids, origin_input_ids=ids, extra_key=None,
                           cache_salt=None, priority=None, kv=kv, lock=None, last_node=None)


def pages_for(req, n):  # n new tokens: the free slots of the last page first, then whole pages
    have = len(req.full_untruncated_fill_ids)
    return max(0, -(-(have + n) // P) - -(-have // P))


def room(pages):  # as the scheduler does before allocating: evict the tree for the shortfall
    short = pages * P - alloc.available_size()
    if short > 0:
        tree.evict(EvictParams(num_tokens=short))
    return alloc.available_size() >= pages * P


def match(req):
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey(req.full_untruncated_fill_ids)))
    req.last_node, matched = m.last_device_node, m.device_prefix_len
    req.lock = tree.lock(req.last_node)  # the matched prefix cannot be evicted from here on
    return matched


def place(req, matched):  # None: no room, and the match is unlocked
    new = len(req.full_untruncated_fill_ids) - matched
    if not room(-(-new // P)):
        tree.unlock(req.lock)
        req.lock = None
        return None
    row = req.kv.req_pool_idx = rows.alloc_rows(1)[0]
    req.kv.cache_protected_len = matched
    rows.write((row, slice(0, matched)), tree.path_device_indices(req.last_node)[:matched])
    rows.write((row, slice(matched, matched + new)), alloc.alloc(-(-new // P) * P)[:new].to(torch.int32))
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
    row = req.kv.req_pool_idx
    in_page = min(n, -have % P)
    if in_page:
        last = int(rows.req_to_token[row, have - 1])
        rows.write((row, slice(have, have + in_page)), torch.arange(last + 1, last + 1 + in_page, dtype=torch.int32))
    if fresh:
        rows.write((row, slice(have + in_page, have + n)), alloc.alloc(fresh * P)[: n - in_page].to(torch.int32))
    req.full_untruncated_fill_ids = req.full_untruncated_fill_ids + array("q", tokens)
    return True


def finish(req):  # what release_kv_cache(req, tree, checkpoint=True) does for a plain request
    end = len(req.full_untruncated_fill_ids)
    tree.checkpoint(req, up_to=end)
    alloc.free(rows.req_to_token[req.kv.req_pool_idx, req.kv.cache_protected_len:end].to(torch.int64))
    tree.unlock(req.lock)
    req.lock = None
    rows.free_rows([req.kv.req_pool_idx])
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
tables = {r.rid: {int(s) // P for s in rows.req_to_token[r.kv.req_pool_idx, :len(r.full_untruncated_fill_ids)]} for r in live}
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


def _pages(slots: Any) -> tuple[int, ...]:
    """The pages of a run of slot ids, in order, each once."""
    return tuple(dict.fromkeys(int(s) // PAGE for s in slots))


class SglangAdapter(Scripted):
    name = "sglang"
    block_size = PAGE
    operations = frozenset({Op.ADMIT, Op.GROW, Op.FINISH, Op.EVICT})
    bad_inputs = frozenset({BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.DOUBLE_UNLOCK})
    preamble = PREAMBLE
    assertions = ASSERTIONS
    releases = ((0, 5, 22), (0, 5, 23))  # MatchResult.device_prefix_len is 0.5.22's

    def __init__(self) -> None:
        from kvoracle.oracle.engines.sglang_hicache import sglang_version  # it imports this module

        require_release("sglang", sglang_version(), *self.releases, type(self).__name__)
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
        done: Any = self.run(f"_ = tree.evict(EvictParams(num_tokens={blocks * PAGE}))")
        return int(done.num_tokens_evicted) // PAGE

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
            rid: _pages(row[r.kv.req_pool_idx, : len(r.full_untruncated_fill_ids)].tolist())
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
