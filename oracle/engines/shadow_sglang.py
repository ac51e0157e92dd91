"""Shadow mode for SGLang 0.5.5.post3 .. 0.5.23's RadixCache and its paged allocator (kvoracle.shadow).

    kvoracle.shadow.attach(tree_cache, engine="sglang")   # wraps the tree and its allocator

The observation is the adapter's (oracle.engines.sglang.SglangAdapter.observe): pages,
the tree's nodes (oracle.engine.descendants), each cached page's `lock_ref`, the
allocator's free pages, and the adapter's three counters, taken at the tree's own page
size (the adapter's `_pages` is fixed at its 4-token page). What differs is who holds
pages, because SGLang's release is a sequence of calls (checkpoint, free the tail, unlock,
free the row) and its request rows are not the truth between them:

- the holders are the tree *locks* the caller took: each `lock(node)` result (a TreeLock)
  is a table listing the pages on its node's path, until `unlock` gives it back
  (`checkpoint` moves the request's lock: the observer follows `req.lock`); a bare
  `inc_lock_ref(node)` is an anonymous holder that a `dec_lock_ref(node)` of the same
  node ends (before 0.5.22 every request's lock is one; `cache_finished_req` and
  `cache_unfinished_req` end or move the request's inside, unseen, and the observer
  follows them). So INV-REFCOUNT reads: each cached page's lock_ref equals the locks
  through its node; a second unlock is found at once (before 0.5.22, when the other
  holder of the node gives its lock back);
- pages the allocator handed out (`alloc`, `alloc_extend`, `alloc_decode`) are the
  requests' own until they are free again or become the tree's (INV-CONSERVE: one
  owner each); when nothing is live (no lock, no request row), such a page is a leak.

It cannot say which request a private page belongs to, nor see a page freed while a
live request still uses it unless a lock covers it (docs/shadow.md). No incremental
checks: full checks at the interval; the blocks a call touched are kept for history.

Reproductions rebuild a plain RadixCache with the adapter's preamble at this size; the
calls are replayed only while they are allocator calls (tree calls take nodes and
requests that a script cannot name), so most reproductions rebuild and show the history.

Importing this module does not import SGLang.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from typing import Any, cast

from kvoracle.oracle.engine import Observation, descendants
from kvoracle.oracle.engines.sglang import preamble
from kvoracle.shadow import Invocation, ObserverBase
from kvoracle.spec import liveness
from kvoracle.spec.invariants import Violation

TREE = ("match_prefix", "insert", "checkpoint", "evict", "lock", "unlock", "inc_lock_ref", "dec_lock_ref", "reset",
        "free_kv_row", "cache_finished_req", "cache_unfinished_req")
ALLOC = ("alloc", "alloc_extend", "alloc_decode", "free", "free_segment", "free_segments", "free_page_ids",
         "free_group_begin", "free_group_end", "clear", "merge_and_sort_free")
ALLOCATES = {"alloc", "alloc_extend", "alloc_decode"}
IN_HAND = "requests' own pages"
# Before 0.5.22 a request's lock is a bare inc_lock_ref on req.last_node, which these calls
# give back inside (True: and take again on the node the request's pages now end on).
MOVES_REQUEST_LOCK = {"cache_finished_req": False, "cache_unfinished_req": True}


class SglangObserver(ObserverBase):
    engine = "sglang"
    classes = ("sglang.srt.mem_cache.radix_cache:RadixCache",)

    def __init__(self, tree: object) -> None:
        self.tree: Any = cast(Any, tree)
        self.alloc: Any = self.tree.token_to_kv_pool_allocator
        self.rows: Any = getattr(self.tree, "req_to_token_pool", None)
        self.P = int(self.tree.page_size)
        self.block_size = self.P
        self.numbers = itertools.count(1)
        self.locks: dict[int, tuple[str, Any]] = {}  # id(TreeLock) -> (name, the lock)
        self.anonymous: list[tuple[str, Any]] = []  # (name, node) of bare inc_lock_ref calls
        self.in_hand: set[int] = set()
        self.rows_free = self._rows_free()

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("tree", self.tree, TREE), ("alloc", self.alloc, ALLOC)]

    def ids(self) -> range:
        return range(1, int(self.alloc.num_pages) + 1)

    # -- pages ---------------------------------------------------------------------------

    def pages(self, slots: Any) -> tuple[int, ...]:
        """The pages of a run of slot ids, in order, each once (the adapter's _pages)."""
        if slots is None:
            return ()
        values = slots.tolist() if hasattr(slots, "tolist") else list(slots)
        return tuple(dict.fromkeys(int(s) // self.P for s in values))

    def path(self, node: Any) -> tuple[int, ...]:
        out: list[int] = []
        root = self.tree.root_node
        while node is not None and node is not root:
            out += self.pages(node.value)
            node = node.parent
        return tuple(out)

    def free(self) -> tuple[int, ...]:
        every = getattr(self.alloc, "get_all_free_pages", None)
        if callable(every):  # from 0.5.20: the free pages and those a need_sort allocator stages
            return tuple(int(p) for p in every().tolist())
        # Before 0.5.20 an allocator built with need_sort (PD disaggregation) frees into
        # release_pages until an alloc runs short and merges them; available_size counts both.
        waiting = getattr(self.alloc, "release_pages", None)
        pages = self.alloc.free_pages.tolist() + (waiting.tolist() if waiting is not None else [])
        return tuple(int(p) for p in pages)

    def _rows_free(self) -> int:
        return int(self.rows.available_size()) if self.rows is not None else 0

    def holders(self) -> dict[str, tuple[int, ...]]:
        held = {name: self.path(lock.node) for name, lock in self.locks.values()}
        held.update((name, self.path(node)) for name, node in self.anonymous)
        return held

    def quiescent(self) -> bool:
        return not self.locks and not self.anonymous and self._rows_free() >= self.rows_free

    # -- around each call ------------------------------------------------------------------

    def before(self, call: Invocation) -> object:
        m = call.method
        if m == "checkpoint":
            return getattr(call.arg(0, "req"), "lock", None)
        if m in MOVES_REQUEST_LOCK:
            return getattr(call.arg(0, "req"), "last_node", None)
        if call.target == "alloc" and m.startswith("free") and m not in ("free_group_begin", "free_group_end"):
            first = call.arg(0, "free_index" if m != "free_page_ids" else "page_ids")
            if m == "free_segments":
                return {p for seg in cast(Iterable[Any], first) for p in self.pages(seg[0])}
            if m == "free_page_ids":
                return {int(p) for p in cast(Any, first).tolist()}
            return set(self.pages(first))
        if m == "unlock" and call.arg(0, "lock") is not None:
            return set(self.path(getattr(call.arg(0, "lock"), "node", None)))
        return None

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        m = call.method
        if call.target == "alloc":
            if m in ALLOCATES:
                got = set(self.pages(result))
                self.in_hand |= got
                return got
            if m == "clear":
                self.in_hand.clear()
                return None
            return cast(set[int] | None, token)
        if m == "lock":
            name = f"lock {next(self.numbers)}"
            self.locks[id(result)] = (name, result)
            return set(self.path(getattr(result, "node", None)))
        if m == "unlock":
            self.locks.pop(id(call.arg(0, "lock")), None)
            return cast(set[int] | None, token) or set()
        if m == "checkpoint":  # the request's lock moved to the node its pages now end on
            new = getattr(call.arg(0, "req"), "lock", None)
            old = self.locks.pop(id(token), None)
            if new is not None and old is not None:
                self.locks[id(new)] = (old[0], new)
            return None
        if m == "inc_lock_ref":
            node = call.arg(0, "node")
            self.anonymous.append((f"lock {next(self.numbers)}", node))
            return set(self.path(node))
        if m == "dec_lock_ref":
            node = call.arg(0, "node")
            self._unlock_anonymous(node)
            return set(self.path(node))
        if m in MOVES_REQUEST_LOCK:  # their own dec_lock_ref (and inc_lock_ref) ran nested, unseen
            moved = self._unlock_anonymous(token)
            now = getattr(call.arg(0, "req"), "last_node", None)
            if moved is not None and now is not None and MOVES_REQUEST_LOCK[m]:
                self.anonymous.append((moved, now))
            return None
        if m == "match_prefix":
            return set()
        return None  # evict, insert, reset, free_kv_row: what changed is not named

    def _unlock_anonymous(self, node: object) -> str | None:
        """End one bare inc_lock_ref holder of `node`; its name (None: there was none)."""
        for i, (name, held) in enumerate(self.anonymous):
            if held is node:
                del self.anonymous[i]
                return name
        return None

    def _anonymous_on(self, node: object) -> str | None:
        return next((name for name, held in self.anonymous if held is node), None)

    # -- observing -------------------------------------------------------------------------

    def observe(self) -> Observation:
        nodes = descendants(self.tree.root_node)
        page_of = {p: n for n in nodes for p in self.pages(n.value)}
        free = self.free()
        self.in_hand -= set(free) | set(page_of)
        tables = self.holders()
        if self.in_hand and not self.quiescent():  # nothing live: a page still handed out is lost
            tables[IN_HAND] = tuple(sorted(self.in_hand))
        idle = [n for n in nodes if n.lock_ref == 0]
        locked = [n for n in nodes if n.lock_ref > 0]
        return Observation(
            ids=self.ids(),
            free=free,
            evictable=tuple(p for p, n in page_of.items() if n.lock_ref == 0),
            tables=tables,
            cached=frozenset(page_of),
            refcounts={p: n.lock_ref for p, n in page_of.items()},
            counters={
                "available_size": (self.alloc.available_size(), self.P * len(free)),
                "evictable_size_": (self.tree.evictable_size_, sum(len(n.value) for n in idle)),
                "protected_size_": (self.tree.protected_size_, sum(len(n.value) for n in locked)),
            },
            nodes=frozenset(f"node {n.id}" for n in nodes),
            findable=frozenset(f"node {n.id}" for n in getattr(self.tree, "evictable_leaves", ())),
        )

    def exiting(self, call: Invocation) -> str | None:
        if call.method == "unlock":
            held = self.locks.get(id(call.arg(0, "lock")))
            return None if held is None else held[0]
        if call.method == "dec_lock_ref":
            return self._anonymous_on(call.arg(0, "node"))
        if call.method == "cache_finished_req":
            return self._anonymous_on(getattr(call.arg(0, "req"), "last_node", None))
        return None

    def table(self, request: str) -> Collection[int]:
        return self.holders().get(request, ())

    def on_raise(self, call: Invocation, error: BaseException) -> list[Violation]:
        if call.method == "evict":
            return liveness.live_evict(None, 0, 0, None, raised=error)
        return []  # an unlock that raised: shadow evaluates LIVE-EXIT itself

    # -- reports and reproductions ---------------------------------------------------------

    def describe(self, value: object) -> str | None:
        kind = type(value).__name__
        v: Any = value
        if kind == "Tensor":
            pages = self.pages(v) if v.dim() == 1 else ()
            shown = ", ".join(map(str, pages[:6])) + (", ..." if len(pages) > 6 else "")
            return f"slots[{v.numel()}] (pages {shown})"
        if kind == "TreeNode":
            return f"node {v.id}"
        if kind == "TreeLock":
            return f"lock on node {v.node.id}"
        if kind == "MatchPrefixParams":
            return f"MatchPrefixParams(key of {len(v.key)} tokens)"
        if kind == "MatchResult":  # a length from 0.5.22; before, the matched slots
            prefix = v.device_prefix_len if hasattr(v, "device_prefix_len") else len(v.device_indices)
            return f"MatchResult(prefix {prefix}, node {v.last_device_node.id})"
        if kind == "EvictParams":
            return f"EvictParams(num_tokens={v.num_tokens})"
        if kind == "EvictResult":
            return f"EvictResult(evicted {v.num_tokens_evicted})"
        if hasattr(v, "rid") and hasattr(v, "kv"):
            return f"req {v.rid!r}"
        return None

    def reproduction(self) -> tuple[str, str] | None:
        if type(self.tree).__name__ != "RadixCache" or type(self.alloc).__name__ != "PagedTokenToKVPoolAllocator":
            return None
        rows = self.rows
        if rows is None:
            return None
        text = preamble(self.P, int(self.alloc.num_pages), int(rows.size), int(rows.max_context_len))
        return text, "tree"

    def statement(self, call: Invocation) -> str | None:
        if call.target != "alloc" or call.kwargs:
            return None
        if call.method in ALLOCATES and call.method == "alloc":
            return f"_ = alloc.alloc({int(cast(int, call.arg(0, 'need_size')))})"
        if call.method == "free":
            slots = cast(Any, call.arg(0, "free_index")).tolist()
            return f"alloc.free(torch.tensor({[int(s) for s in slots]!r}, dtype=torch.int64))"
        return None
