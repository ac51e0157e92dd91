"""Shadow mode for vLLM 0.11.2 .. 0.34.0's KVCacheManager and its BlockPool (kvoracle.shadow).

    kvoracle.shadow.attach(scheduler.kv_cache_manager, engine="vllm")

The observation is the adapter's (oracle.engines.vllm.VllmAdapter.observe: the free
queue, cached blocks, ref_cnt, the free counter), with three changes that a manager
living inside a real scheduler needs:

- ids are the pool's own (1..num_gpu_blocks-1: block 0 is the null block);
- tables are every KV cache group's `req_to_blocks`, *without the null block*. vLLM's
  null block 0 is a placeholder (a sliding-window or mamba table points every skipped
  position at it); it holds no KV and its ref_cnt is not kept. Two live requests that
  both list it share nothing: counting it would be a false INV-NO-UAF (and INV-TIER, as
  it is outside the usable ids). If the null block ever reaches the free queue, that is
  still found: INV-TIER, 0 is outside the ids;
- blocks that something outside the request tables still holds are tables of their own:
  a deferred free (`pop_blocks_for_free` took a finished request's blocks, and the
  scheduler passes them to the pool's `free_blocks` only when the GPU step that may still
  write them is done), a copy-on-write retention (`take_kv_cache_block_copies`, and CoW
  pairs still pending in a manager), blocks taken from the pool (`get_new_blocks`) or
  touched (`touch`) by the caller directly. Each is released when those blocks are passed
  to `free_blocks`. Without this, the window between `pop_blocks_for_free` and
  `free_blocks` reads as blocks held by nobody: a false INV-REFCOUNT and INV-CONSERVE.

Incremental checks: a manager call about one request changes only that request's blocks
(before and after), plus the blocks a hold gained or lost; the observer keeps an index
(block -> tables listing it) to cut the observation to any range of ids in time
proportional to the range. A call it cannot scope (reset_prefix_cache, unpin_blocks, a
free_blocks of a generator) gets a full check.

Reproductions: when the manager has one full-attention group, the adapter's preamble
(manager_preamble) rebuilds it at its size, and each call is written against that
namespace (requests re-created from their tokens as the call saw them).

Importing this module does not import vLLM.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

from kvoracle.oracle.engine import Observation, scheduler_view
from kvoracle.oracle.engines.vllm import VllmAdapter, empty_entries, manager_preamble, waiting_queues
from kvoracle.oracle.engines.vllm_connector import NEWEST, vllm_version
from kvoracle.shadow import Invocation, ObserverBase, Progress
from kvoracle.spec.state import blocks_for

MANAGER = ("get_computed_blocks", "allocate_slots", "free", "pop_blocks_for_free", "remove_skipped_blocks",
           "cache_blocks", "evict_blocks", "reset_prefix_cache", "take_kv_cache_block_copies")
POOL = ("get_new_blocks", "free_blocks", "touch", "cache_full_blocks", "evict_blocks", "reset_prefix_cache",
        "unpin_blocks")
# BlockPool.touch takes one sequence of blocks from 0.14.0; up to 0.13.0 a tuple of sequences,
# one per KV cache group (KVCacheBlocks.blocks as it is).
FLAT_TOUCH_FROM = (0, 14, 0)
ABOUT_A_REQUEST = {"get_computed_blocks", "allocate_slots", "free", "pop_blocks_for_free", "cache_blocks"}
EXITS = {"free", "pop_blocks_for_free"}

# Names in a reproduction's namespace: `request`, `mgr`, `pool` come from manager_preamble.
REPLAY_HELPERS = """
R = {}  # request id -> the Request, re-created from the tokens each call saw


def sync(rid, prompt, outputs, computed):
    if rid not in R:
        R[rid] = request(rid, prompt)
    if outputs:
        R[rid].append_output_token_ids(outputs)
    R[rid].num_computed_tokens = computed
    return R[rid]
"""


REVERSED: tuple[type, ...] = (type(reversed([])), reversed)  # reversed(list) is a list_reverseiterator


def peek(items: object) -> list[Any] | None:
    """The items of a list, tuple or reversed(list) without consuming anything (None: an
    iterator shadow must not touch). The scheduler frees deferred blocks as
    `free_blocks(reversed(blocks))`; `reversed` exposes its list through __reduce__."""
    if isinstance(items, list | tuple):
        return list(items)
    if isinstance(items, REVERSED):
        reduced: Any = items.__reduce__()
        if len(reduced) == 3 and reduced[0] is reversed:
            seq, index = reduced[1][0], reduced[2]
            return list(seq[index::-1]) if index >= 0 else []
        return []  # exhausted
    return None


def _underlying(items: object) -> object:
    """The list object a reversed() iterates (identity of a deferred free's list)."""
    if isinstance(items, REVERSED):
        reduced: Any = items.__reduce__()
        if len(reduced) == 3 and reduced[0] is reversed:
            return cast(object, reduced[1][0])
    return items


class VllmObserver(ObserverBase):
    engine = "vllm"
    classes = ("vllm.v1.core.kv_cache_manager:KVCacheManager",)

    def __init__(self, mgr: object) -> None:
        self.mgr: Any = cast(Any, mgr)
        self.pool: Any = self.mgr.block_pool
        managers = self.mgr.coordinator.single_type_managers
        self.managers: list[Any] = [m for m in managers if m.block_pool is self.pool]
        self.block_size = int(self.managers[0].block_size) if self.managers else 1
        self.copy: dict[str, tuple[int, ...]] = {}  # request -> its blocks as last seen
        self.holds: dict[str, list[int]] = {}  # "deferred free 3 (r1)" -> the blocks it still holds
        self.hold_lists: dict[str, object] = {}  # hold -> the list object the caller keeps (identity)
        self.where: dict[int, set[str]] = {}  # block -> the tables listing it
        self.numbers = itertools.count(1)
        self.rendered: dict[str, int] = {}  # request -> output tokens already written in the script
        self.pending: tuple[int, ...] = ()  # the blocks of pending CoW copies, as indexed
        self.grouped_touch = (vllm_version() or NEWEST) < FLAT_TOUCH_FROM
        self.empty_entries = empty_entries()  # a refused request's empty entry is no table (up to 0.13)
        self.resync()

    # -- what to wrap, and the index -------------------------------------------------------

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("mgr", self.mgr, MANAGER), ("pool", self.pool, POOL)]

    def ids(self) -> range:
        return range(1, int(self.pool.num_gpu_blocks))

    def _table(self, rid: str) -> tuple[int, ...]:
        out: list[int] = []
        for m in self.managers:
            out += [b.block_id for b in m.req_to_blocks.get(rid, ()) if not b.is_null]
        return tuple(out)

    def _pending(self) -> tuple[int, ...]:
        """Both ends of CoW copies still pending in a manager (each holds a reference)."""
        return tuple(b.block_id for m in self.managers for pair in getattr(m, "_pending_cow_copies", ())
                     for b in pair if not b.is_null)

    def tables(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, list[int]] = {}
        for m in self.managers:
            for rid, blocks in m.req_to_blocks.items():
                if blocks or not self.empty_entries:
                    out.setdefault(rid, []).extend(b.block_id for b in blocks if not b.is_null)
        tables = {rid: tuple(t) for rid, t in out.items()}
        tables.update((h, tuple(t)) for h, t in self.holds.items() if t)
        pending = self._pending()
        if pending:
            tables["copies pending"] = pending
        return tables

    def resync(self) -> None:
        """Rebuild the index from vLLM's structures (after a full observation)."""
        tables = self.tables()
        self.copy = {r: t for r, t in tables.items() if r not in self.holds and r != "copies pending"}
        self.pending = tables.get("copies pending", ())
        self.where = {}
        for name, t in tables.items():
            for b in t:
                self.where.setdefault(b, set()).add(name)

    def _index(self, name: str, old: Iterable[int], new: Iterable[int]) -> set[int]:
        old_set, new_set = set(old), set(new)
        for b in old_set - new_set:
            names = self.where.get(b)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.where[b]
        for b in new_set - old_set:
            self.where.setdefault(b, set()).add(name)
        return old_set | new_set

    def _request(self, rid: str) -> set[int]:
        old = self.copy.pop(rid, ())
        new = self._table(rid)
        if new or any(rid in m.req_to_blocks for m in self.managers):
            self.copy[rid] = new
        return self._index(rid, old, new)

    def _hold(self, kind: str, blocks: Iterable[Any], keep: object = None, of: str = "") -> set[int]:
        ids = [b.block_id for b in blocks if not b.is_null and _pool_of(b) in (None, self.pool)]
        if not ids:
            return set()
        name = f"{kind} {next(self.numbers)}" + (f" ({of})" if of else "")
        self.holds[name] = ids
        if keep is not None:
            self.hold_lists[name] = keep
        return self._index(name, (), ids)

    def _release(self, ids: list[int], source: object) -> set[int]:
        """free_blocks(ids): the hold whose list it is goes; else each id leaves the
        newest hold listing it. Ids no hold lists were a request's (or free): a misuse
        the properties will show."""
        touched: set[int] = set()
        for name, kept in list(self.hold_lists.items()):
            if kept is source:
                touched |= self._index(name, self.holds.pop(name, []), ())
                del self.hold_lists[name]
                return touched | set(ids)
        for b in ids:
            for name in reversed(list(self.holds)):
                held = self.holds[name]
                if b in held:
                    before = list(held)
                    held.remove(b)
                    touched |= self._index(name, before, held)
                    if not held:
                        del self.holds[name]
                        self.hold_lists.pop(name, None)
                    break
        return touched | set(ids)

    def _reconcile(self) -> None:
        """After a call whose blocks shadow could not see: a hold keeps a block only as far
        as vLLM's ref_cnt still counts it."""
        counted: dict[int, int] = {}
        for name, t in self.tables().items():
            if name not in self.holds:
                for b in set(t):
                    counted[b] = counted.get(b, 0) + 1
        for name in list(self.holds):
            keep = []
            for b in self.holds[name]:
                if self.pool.blocks[b].ref_cnt > counted.get(b, 0):
                    keep.append(b)
                    counted[b] = counted.get(b, 0) + 1
            self.holds[name] = keep
            if not keep:
                del self.holds[name]
                self.hold_lists.pop(name, None)

    # -- around each call ------------------------------------------------------------------

    def before(self, call: Invocation) -> object:
        if call.target == "pool" and call.method in ("free_blocks", "touch", "cache_full_blocks"):
            items = call.arg(1 if call.method == "cache_full_blocks" else 0,
                             "blocks" if call.method == "cache_full_blocks" else "ordered_blocks"
                             if call.method == "free_blocks" else "blocks")
            seen = peek(items)
            if seen is not None and call.method == "touch" and self.grouped_touch:
                seen = [b for group in seen for b in group]
            return None if seen is None else ([b.block_id for b in seen if not b.is_null], _underlying(items))
        return None

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        m = call.method
        if call.target == "mgr":
            touched: set[int] = set()
            if m in ABOUT_A_REQUEST:
                touched = self._request(str(getattr(call.arg(0, "request"), "request_id")))
            elif m == "remove_skipped_blocks":
                touched = self._request(str(call.arg(0, "request_id")))
            elif m == "evict_blocks":
                touched = {int(b) for b in cast(Iterable[int], call.arg(0, "block_ids"))}
            elif m == "take_kv_cache_block_copies":
                retained = cast(tuple[Any, list[Any]], result)[1]
                touched = self._hold("copy retention", retained, retained)
            else:
                return None  # reset_prefix_cache
            if m == "pop_blocks_for_free":
                rid = str(getattr(call.arg(0, "request"), "request_id"))
                touched |= self._hold("deferred free", cast(list[Any], result), result, rid)
            return touched | self._pending_changed()
        changed = self._pool_call(call, token, result)
        if changed is None:
            self._reconcile()
            return None  # reset_prefix_cache, unpin_blocks, a free of an iterator
        # A request table changed behind a manager method shadow did not see (one bound
        # before attach): read again the tables that list these blocks.
        for b in list(changed):
            for name in list(self.where.get(b, ())):
                if name in self.copy:
                    changed |= self._request(name)
        return changed

    def _pool_call(self, call: Invocation, token: object, result: object) -> set[int] | None:
        m = call.method
        if m == "get_new_blocks":
            return self._hold("taken from the pool", cast(list[Any], result))
        if m in ("free_blocks", "touch") and token is not None:
            ids, source = cast(tuple[list[int], object], token)
            if m == "touch":
                return self._hold("touched", [self.pool.blocks[b] for b in ids])
            return self._release(ids, source)
        if m == "cache_full_blocks" and token is not None:
            return set(cast(tuple[list[int], object], token)[0])
        if m == "evict_blocks":
            return {int(b) for b in cast(Iterable[int], call.arg(0, "block_ids"))}
        return None

    def _pending_changed(self) -> set[int]:
        now, old = self._pending(), self.pending
        if not now and not old:
            return set()
        self.pending = now
        return self._index("copies pending", old, now)

    # -- observing -------------------------------------------------------------------------

    def observe(self) -> Observation:
        o = VllmAdapter.observe(cast(Any, SimpleNamespace(pool=self.pool, mgr=self.mgr)))
        self._reconcile()
        self.resync()
        return replace(o, ids=self.ids(), tables=self.tables())

    def observe_range(self, ids: range) -> Observation:
        blocks = self.pool.blocks
        free: list[int] = []
        evictable: list[int] = []
        cached: list[int] = []
        refcounts: dict[int, int] = {}
        tables: dict[str, list[int]] = {}
        where, listing = self.where, tables.setdefault
        for b in ids:
            block = blocks[b]
            hashed = block.block_hash is not None
            if block.prev_free_block is not None:  # in the free queue (its links are set)
                (evictable if hashed else free).append(b)
            if hashed:
                cached.append(b)
            refcounts[b] = block.ref_cnt
            names = where.get(b)
            if names:
                for name in names:
                    listing(name, []).append(b)
        return Observation(ids=ids, free=tuple(free), evictable=tuple(evictable),
                           tables={r: tuple(t) for r, t in tables.items()}, cached=frozenset(cached),
                           refcounts=refcounts)

    def table(self, request: str) -> Collection[int]:
        return self._table(request)

    def exiting(self, call: Invocation) -> str | None:
        if call.target == "mgr" and call.method in EXITS:
            return str(getattr(call.arg(0, "request"), "request_id"))
        return None

    def quiescent(self) -> bool:
        return not self.tables()

    # -- reports and reproductions ---------------------------------------------------------

    def describe(self, value: object) -> str | None:
        kind = type(value).__name__
        v: Any = value
        if kind == "KVCacheBlock":
            return f"#{v.block_id}"
        if kind == "Request":
            return f"Request({v.request_id!r}, {v.num_tokens} tokens, {v.num_computed_tokens} computed)"
        if kind == "KVCacheBlocks":
            return "KVCacheBlocks(" + ", ".join(f"[{', '.join(f'#{b.block_id}' for b in g)}]" for g in v.blocks) + ")"
        if isinstance(value, REVERSED):
            seen = peek(value)
            return "reversed(...)" if seen is None else f"reversed([{', '.join(f'#{b.block_id}' for b in seen)}])"
        return None

    def reproduction(self) -> tuple[str, str] | None:
        groups = self.mgr.kv_cache_config.kv_cache_groups
        if len(groups) != 1 or type(groups[0].kv_cache_spec).__name__ != "FullAttentionSpec":
            return None
        spec = groups[0].kv_cache_spec
        if not self.mgr.enable_caching:
            return None
        preamble = manager_preamble(int(spec.block_size), int(self.pool.num_gpu_blocks), int(self.mgr.max_model_len))
        return preamble + REPLAY_HELPERS, "mgr"

    def statement(self, call: Invocation) -> str | None:
        try:
            args = [self._render(a) for a in call.args] + [f"{k}={self._render(v)}" for k, v in call.kwargs.items()]
        except Exception:  # noqa: BLE001 - _Unwritable, or a value of a shape this version does not know
            return None
        return f"_ = {call.target}.{call.method}({', '.join(args)})"

    def _render(self, value: object) -> str:
        kind = type(value).__name__
        v: Any = value
        if value is None or isinstance(value, bool | int | float | str):
            return repr(value)
        if kind == "KVCacheBlock":
            return f"pool.blocks[{v.block_id}]"
        if kind == "Request":
            rid = v.request_id
            outputs = list(v.output_token_ids)
            first = rid not in self.rendered
            new = outputs if first else outputs[self.rendered[rid]:]
            self.rendered[rid] = len(outputs)
            prompt = repr(list(v.prompt_token_ids)) if first else "None"
            return f"sync({rid!r}, {prompt}, {new!r}, {v.num_computed_tokens})"
        if kind == "KVCacheBlocks":
            groups = ", ".join("[" + ", ".join(self._render(b) for b in g) + "]" for g in v.blocks)
            return f"mgr.create_kv_cache_blocks(({groups},))"
        if isinstance(value, list | tuple | set | frozenset):
            inner = ", ".join(self._render(x) for x in value)
            return {list: f"[{inner}]", tuple: f"({inner},)" if len(value) == 1 else f"({inner})"}.get(
                type(value), f"{{{inner}}}" if value else "set()")
        if isinstance(value, REVERSED):
            seen = peek(value)
            if seen is None:
                raise _Unwritable
            return f"reversed([{', '.join(self._render(b) for b in reversed(seen))}])"
        raise _Unwritable


class _Unwritable(Exception):
    """A value a reproduction cannot write down."""


def _pool_of(block: Any) -> Any:
    """The pool a block came from (None: not noted); 0.34 notes it through a weak reference."""
    pool = getattr(block, "pool", None)
    return pool() if isinstance(pool, weakref.ref) else pool


# --- the Scheduler: LIVE-ADMIT and LIVE-PROGRESS on each scheduling step -----------------------

SCHEDULER = ("schedule", "add_request", "finish_requests", "update_from_output")
KEEPS_PROGRESS = frozenset({"add_request", "update_from_output"})  # a new request; a step's results taken in
QUEUED = frozenset({"WAITING", "PREEMPTED"})  # waiting for room alone: what LIVE-ADMIT may ask to admit
REMOTE = "WAITING_FOR_REMOTE_KVS"  # waiting for room alone once its load has ended


class VllmSchedulerObserver(ObserverBase):
    """vLLM's Scheduler (tried on 0.11.2 .. 0.34.0) as a scheduler: each `schedule` call is one
    scheduling step, judged by LIVE-ADMIT and LIVE-PROGRESS (`kvoracle.shadow`, Progress).

        kvoracle.shadow.attach(scheduler, engine="vllm-scheduler")

    It reports no blocks: its manager's observer ("vllm", attached to
    `scheduler.kv_cache_manager`) checks those. What a step needs is known only for a
    manager with one KV cache group (a hybrid model's groups each take blocks of their
    own); with more, while a request waits on something other than room (a grammar,
    streamed input), and while the scheduler is paused (0.34's `pause_state`), nothing is asked. A request whose remote KV load has not ended, a
    finished request whose blocks are still held for sending, and blocks referenced
    outside every table count as transfers in flight; a request whose load has ended
    waits for room like any other."""

    engine = "vllm-scheduler"
    classes = ("vllm.v1.core.sched.scheduler:Scheduler", "vllm.v1.core.sched.async_scheduler:AsyncScheduler")

    def __init__(self, sched: object) -> None:
        self.sched: Any = cast(Any, sched)
        self.pool: Any = self.sched.kv_cache_manager.block_pool
        self.block_size = int(self.sched.block_size)
        self.one_group = len(self.sched.kv_cache_manager.coordinator.single_type_managers) == 1

    def targets(self) -> Sequence[tuple[str, object, Sequence[str]]]:
        return [("sched", self.sched, SCHEDULER)]

    def ids(self) -> range:
        return range(0)  # the blocks are the manager observer's

    def observe(self) -> Observation:
        return Observation(ids=range(0))

    def after(self, call: Invocation, token: object, result: object) -> Collection[int] | None:
        return frozenset()

    def quiescent(self) -> bool:
        return False  # LIVE-DRAIN is the manager observer's

    def scheduling(self, call: Invocation) -> bool:
        return call.method == "schedule"

    def keeps_progress(self, call: Invocation) -> bool:
        return call.method in KEEPS_PROGRESS

    def progress(self) -> Progress:
        sched = self.sched
        waiting = [r for queue in waiting_queues(sched) for r in queue]
        running = {r.request_id: r for r in sched.running}
        held = [r for r in sched.requests.values() if r.is_finished()]  # blocks kept for a send
        ended = sched.finished_recving_kv_req_ids | sched.failed_recving_kv_req_ids
        loading = [r for r in waiting if r.status.name == REMOTE and r.request_id not in ended]
        free = tuple(b.block_id for b in self.pool.free_block_queue.get_all_free_blocks())
        o = Observation(ids=range(1, int(self.pool.num_gpu_blocks)), free=free,
                        waiting=frozenset(r.request_id for r in waiting),
                        tokens={rid: int(r.num_computed_tokens) for rid, r in running.items()})
        live = [rid for rid, r in sched.requests.items() if not r.is_finished()]
        size = self.block_size

        def need(r: Any) -> int:
            return blocks_for(int(r.num_tokens) + 1, size)

        ready = [r for r in waiting if r.status.name in QUEUED or (r.status.name == REMOTE and r.request_id in ended)]
        judged = self.one_group and getattr(getattr(sched, "_pause_state", None), "name", "UNPAUSED") == "UNPAUSED"
        needs = {r.request_id: need(r) for r in ready} if judged else {}
        growth = {rid: need(r) for rid, r in running.items()} if judged else {}
        return Progress(scheduler_view(o, None, live, size), needs, growth, int(self.pool.num_gpu_blocks) - 1,
                        len(loading) + len(held) + self._held_outside(len(free)))

    def _held_outside(self, free: int) -> int:
        """1 when a block is referenced and no request's table lists it (a deferred free,
        a connector holding blocks for its transfer, or a leak, which the manager's
        observer names), else 0: something the engine waits for is in flight."""
        tables = self.sched.kv_cache_manager.coordinator.single_type_managers
        listed = {b.block_id for m in tables for blocks in m.req_to_blocks.values() for b in blocks if not b.is_null}
        return int(int(self.pool.num_gpu_blocks) - 1 - free > len(listed))
