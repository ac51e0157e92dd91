"""The engine adapter Protocol: what a stateful machine drives in an engine it did not
write, what it may observe, and the invariants those observations allow it to check.

An engine's own calls are grouped into request-level operations, because that is the
grain at which every engine's scheduler uses its cache:

    admit   = match the prompt's cached prefix, lock it, allocate the rest (with PREFILL,
              the machine admits the prompt's first chunk: the rest comes by prefill)
    prefill = compute the next chunk of a request's prompt: allocate its blocks, cache
              the full blocks it completes (the machine chooses the chunks and how the
              chunks of different requests interleave)
    grow    = decode filled the last block: allocate one more
    finish  = end the request: unlock its cached blocks, free the rest (engines differ
              in when they cache: at admit, per chunk, or here)
    evict   = free up to n unreferenced cached blocks

Bad inputs are raw calls an engine's own code could make by mistake (a block freed twice,
a request finished twice, a node unlocked twice). Each adapter declares what it supports;
the machine uses only that, and checks every invariant its observations allow.
"""

from __future__ import annotations

import ast
import enum
import functools
import keyword
import numbers
import re
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import CodeType
from typing import Any, ClassVar, Protocol

from kvoracle.oracle import watchdog
from kvoracle.oracle.journal import Journal
from kvoracle.spec import invariants
from kvoracle.spec.invariants import Violation
from kvoracle.spec.view import TierView, View

NOBODY = 10**6  # a request or transfer id no campaign reaches (bad calls about one that never existed)
CACHE, TRANSFER = "the cache", "a transfer"  # owners an observation can name


class Op(enum.Enum):
    ADMIT = "admit"
    PREFILL = "prefill"
    GROW = "grow"
    FINISH = "finish"
    EVICT = "evict"


REQUIRED_OPS = (Op.ADMIT, Op.FINISH)  # every engine adapter supports these; the others are optional


class BadInput(enum.Enum):
    """Each adapter declares the kinds it can make; the machines draw only those."""

    DOUBLE_FREE = "double_free"  # free a block that is already free, through the allocator
    REPEATED_FREE = "repeated_free"  # free a batch that names one in-use block twice
    OUT_OF_RANGE = "out_of_range"  # free a block id the allocator never had
    DOUBLE_FINISH = "double_finish"  # finish a request that already finished (scheduler level: or was aborted)
    DOUBLE_UNLOCK = "double_unlock"  # unlock a finished request's prefix again while another request holds it
    # the cache with tiers and transfers (oracle.tiered)
    WRONG_TIER = "wrong_tier"  # free a GPU block id through the CPU allocator
    UNKNOWN_REQUEST = "unknown_request"  # a call about a request that never existed
    UNKNOWN_TRANSFER = "unknown_transfer"  # complete a transfer that never existed
    BAD_PARTIAL = "bad_partial"  # complete a transfer with more items done than it has
    DUPLICATE_REQUEST = "duplicate_request"  # start a request under an id in use (cache: live; scheduler: ever)
    HASH_MISMATCH = "hash_mismatch"  # commit more hashes than the request has blocks
    TOO_MANY = "too_many"  # allocate more blocks than are free
    BUSY_RESET = "busy_reset"  # reset the cache while requests are live
    NEGATIVE_LIMIT = "negative_limit"  # match a new request with a negative block limit
    COMMIT_FILLING = "commit_filling"  # commit a request whose swap-in or prefetch is still filling its blocks
    WRITE_TOO_MANY = "write_too_many"  # release a request with more hashes to write than it has blocks
    # the scheduler (oracle.serving)
    DOUBLE_ABORT = "double_abort"  # abort a request that already exited (aborted, or finished)
    TOO_LARGE = "too_large"  # submit a prompt larger than the whole GPU pool
    EMPTY = "empty"  # submit a prompt with no tokens
    PREEMPT_WAITING = "preempt_waiting"  # preempt a request that is not running
    DUPLICATE_BATCH = "duplicate_batch"  # finish a batch that names a request twice


# The kinds each machine draws from (an adapter may declare fewer).
REQUEST_LEVEL = (BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.DOUBLE_FINISH, BadInput.DOUBLE_UNLOCK)
CACHE_LEVEL = (BadInput.DOUBLE_FREE, BadInput.OUT_OF_RANGE, BadInput.WRONG_TIER, BadInput.DOUBLE_FINISH,
               BadInput.UNKNOWN_REQUEST, BadInput.UNKNOWN_TRANSFER, BadInput.BAD_PARTIAL,
               BadInput.DUPLICATE_REQUEST, BadInput.HASH_MISMATCH, BadInput.TOO_MANY, BadInput.BUSY_RESET,
               BadInput.NEGATIVE_LIMIT, BadInput.COMMIT_FILLING, BadInput.WRITE_TOO_MANY, BadInput.REPEATED_FREE)
SCHEDULER_LEVEL = (BadInput.UNKNOWN_REQUEST, BadInput.DOUBLE_FINISH, BadInput.DOUBLE_ABORT, BadInput.TOO_LARGE,
                   BadInput.DUPLICATE_REQUEST, BadInput.EMPTY, BadInput.PREEMPT_WAITING, BadInput.DUPLICATE_BATCH)


class NoRoom(Exception):
    """The engine cannot place the request now (it would have to wait or preempt).
    An adapter raises it only after the engine left its state as it was."""


@dataclass(frozen=True)
class Observation:
    """What an engine exposes of its state, in block ids. None: not observable."""

    ids: range  # every block id the engine may hand out
    free: tuple[int, ...] | None = None  # on the free list(s), duplicates kept, cached blocks excluded
    evictable: tuple[int, ...] | None = None  # cached, referenced by nobody, reclaimable on demand
    tables: Mapping[str, tuple[int, ...]] | None = None  # live request -> its blocks
    cached: frozenset[int] | None = None  # blocks the prefix cache indexes
    refcounts: Mapping[int, int] | None = None  # block -> the engine's reference count
    counters: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # name -> (reported, recounted)
    # Scheduler-level engines decide themselves who runs: requests they hold without
    # blocks (queued, or preempted), and each running request's tokens with KV computed.
    waiting: frozenset[str] | None = None
    tokens: Mapping[str, int] | None = None
    # Engines with transfers: blocks in-flight transfers read (swap-out and write sources:
    # INV-PIN), as a set or as block -> the requests each is read for (a block a transfer
    # reads for its own request may be in that request's table); and blocks they own
    # (destinations they fill, blocks a write took over from a request that ended).
    # None: not observed; in_flight () says no transfer owns any.
    pinned: frozenset[int] | Mapping[int, tuple[str, ...]] | None = None
    in_flight: tuple[int, ...] | None = ()
    # Engines whose tree can be walked: its nodes (any names), and the nodes its eviction
    # structure (heap, leaf set) holds; a held node not in the tree is INV-HEAP-SOUND.
    nodes: frozenset[str] | None = None
    findable: frozenset[str] | None = None


class EngineAdapter(Protocol):
    """One engine instance behind the operations above. Request ids are strings."""

    name: str
    block_size: int
    operations: frozenset[Op]
    bad_inputs: frozenset[BadInput]

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        """Place a new request; return how many leading blocks came from the cache.
        Raise NoRoom (state unchanged) when it does not fit."""
        ...

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        """Compute `tokens`, the next chunk of a running request's prompt (with Op.PREFILL).
        NoRoom as above."""
        ...

    def grow(self, rid: str, tokens: Sequence[int]) -> None:
        """Append `tokens` (one block's worth) to a running request. NoRoom as above."""
        ...

    def finish(self, rid: str) -> None: ...

    def evict(self, blocks: int) -> int:
        """Free up to `blocks` unreferenced cached blocks; return how many were freed."""
        ...

    def bad_input(self, kind: BadInput, rid: str | None) -> bool:
        """Make the bad call (about `rid` where the kind needs one). False: not
        applicable in this state, nothing was called. Exceptions propagate."""
        ...

    def observe(self) -> Observation: ...

    def script(self) -> list[str]:
        """The engine calls made so far, as Python statements (for reproductions)."""
        ...

    # Python statements, run after a script, that fail with "<ID>: ..." when the engine's
    # state breaks a property the adapter can observe (the end of a reproduction file).
    assertions: str


def descendants(root: Any) -> list[Any]:
    """Every node below an engine's tree root, through each node's `children` dict
    (SGLang's and FastDeploy's radix trees both link children that way)."""
    out: list[Any] = []
    todo = list(root.children.values())
    while todo:
        out.append(todo.pop())
        todo.extend(out[-1].children.values())
    return out


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


MOST_BLOCKS = 1 << 22  # a campaign's pool: more ids than this is no pool its machines can walk


def size_problem(name: str, value: object, least: int) -> str:
    """What is wrong with `value` as the size `name` an adapter declares ('': nothing): an
    integer (numpy's too), not a bool, of at least `least`."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= least:
        return ""
    return f"{name} = {value!r} (an int of at least {least} is needed)"


class MalformedObservation(TypeError):
    """An adapter's observation that no property can be judged on (a one-shot iterator
    for a list, a pool of 10**30 ids): said as the adapter's, not blamed on the engine."""


_COLLECTIONS = frozenset({tuple, list, set, frozenset, dict})  # the usual ones, known without an ABC check


def _collection(value: object) -> bool:
    return type(value) in _COLLECTIONS or isinstance(value, Collection)
_MAPPINGS = {"tables": "request to its blocks", "refcounts": "block to its count",
             "counters": "name to (reported, recounted)", "tokens": "request to its tokens computed"}


def shaped(name: str, o: Observation, most: int | None = None) -> None:
    """MalformedObservation where a field of `o` is not what Observation says it is (and,
    given `most`, where `ids` holds more ids than that, or a field names a block by
    anything but an integer: a walk over every id, made once, before a campaign)."""
    if not isinstance(o.ids, range):
        raise MalformedObservation(f"the {name} observation's ids must be a range, not {o.ids!r}")
    if most is not None and o.ids.stop - o.ids.start > most * abs(o.ids.step):  # len() overflows past 2**63
        raise MalformedObservation(f"the {name} observation's ids must be at most {most:,} block ids, not {o.ids!r}")
    for field_name in ("free", "evictable", "in_flight", "cached", "nodes", "findable", "waiting", "pinned"):
        value = getattr(o, field_name)
        if value is not None and not _collection(value):
            raise MalformedObservation(f"the {name} observation's {field_name} is a {type(value).__name__}, "
                                       "not a collection (read more than once)")
    if o.counters is None:  # (no counters is {}, as the default)
        raise MalformedObservation(f"the {name} observation's counters are None: give {{}} for none")
    for field_name, holds in _MAPPINGS.items():
        value = getattr(o, field_name)
        if value is not None and type(value) is not dict and not isinstance(value, Mapping):
            raise MalformedObservation(f"the {name} observation's {field_name} is a {type(value).__name__}, "
                                       f"not a mapping of {holds}")
    if any(type(pair) is not tuple and not isinstance(pair, Sequence) or len(pair) != 2 for pair in o.counters.values()):
        raise MalformedObservation(f"the {name} observation's counters must map each name to a pair (reported, "
                                   f"recounted), not {dict(o.counters)!r}")
    for r, table in (o.tables or {}).items():
        if not _collection(table):
            raise MalformedObservation(f"the {name} observation's table of {r!r} is a {type(table).__name__}, "
                                       "not a collection of blocks")
    for b, readers in (o.pinned.items() if isinstance(o.pinned, Mapping) else ()):
        if not _collection(readers):
            raise MalformedObservation(f"the {name} observation's pinned maps block {b!r} to a "
                                       f"{type(readers).__name__}, not to the requests it is read for")
    if most is not None:
        _integer_ids(name, o)


def _integer_ids(name: str, o: Observation) -> None:
    """MalformedObservation where a field of `o` names a block by anything but an integer."""
    fields: dict[str, Iterable[object] | None] = {
        "free": o.free, "evictable": o.evictable, "in_flight": o.in_flight, "cached": o.cached,
        "refcounts": o.refcounts, "pinned": o.pinned,
        "tables": None if o.tables is None else (b for table in o.tables.values() for b in table)}
    for field_name, ids in fields.items():
        for b in ids or ():
            if not isinstance(b, numbers.Integral) or isinstance(b, bool):
                raise MalformedObservation(f"the {name} observation's {field_name} names a block by {b!r}, "
                                           "not by its integer id")


def tier_view(name: str, o: Observation) -> TierView:
    """One tier of an observation as a spec view: what the engine reports, nothing more."""
    shaped(name, o)
    return TierView(
        name, o.ids, free=o.free,
        cached=None if o.cached is None else {b: (CACHE,) for b in o.cached},
        in_flight=None if o.in_flight is None else {b: (TRANSFER,) for b in o.in_flight},
        reads=None if o.pinned is None else (
            dict(o.pinned) if isinstance(o.pinned, Mapping) else {b: ("",) for b in o.pinned}),
        evictable=None if o.evictable is None else frozenset(o.evictable),
        refcounts=o.refcounts, counters=o.counters, nodes=_set(o.nodes), findable=_set(o.findable),
    )


def _set(names: Collection[str] | None) -> frozenset[str] | None:
    """A field the properties take set differences of, whatever collection it came as."""
    return None if names is None else frozenset(names)


def view_of(o: Observation, cpu: Observation | None = None, live: Mapping[str, int] | None = None,
            block_size: int = 1) -> View:
    """The partial state an engine's observation allows (spec.view): `live` maps each
    request the checker expects to be live to the tokens it expects computed (used where
    the engine does not report `tokens`). Every property of spec/ is evaluated on it;
    what the observation leaves out stays unchecked."""
    computed = o.tokens if o.tokens is not None else live
    return View(
        tier_view("GPU", o), None if cpu is None else tier_view("CPU", cpu), tables=o.tables,
        live=None if live is None else frozenset(live),
        queued=_set(o.waiting) or frozenset(),  # an engine without a queue holds none
        computed=computed, block_size=block_size,
    )


def scheduler_view(o: Observation, cpu: Observation | None, live: Sequence[str], block_size: int) -> View:
    """The view of a scheduler-level engine, which decides itself what it computes: the
    requests it holds are `live`, and its `computed` tokens are what it reports, or
    unknown (LIVE-PROGRESS is then not judged; INV-REQUEST asks for no table)."""
    v = view_of(o, cpu, {r: 0 for r in live}, block_size)
    return v if o.tokens is not None else replace(v, computed=None)


def check(o: Observation, live: Mapping[str, int], block_size: int, cpu: Observation | None = None) -> list[Violation]:
    """Every safety property of spec/ the observation allows."""
    return invariants.check(view_of(o, cpu, live, block_size))


def with_observed(own: list[Violation], observed: list[Violation]) -> list[Violation]:
    """The engine's own checks, then what the observation shows that they missed (a
    property they already report is not repeated in the observation's words)."""
    seen = {v.id for v in own}
    return own + [v for v in observed if v.id not in seen]


def not_free(o: Observation) -> int:
    """Blocks of the tier not on its free list (draining ends at 0)."""
    return len(o.ids) - len(set(o.free or ()))


# a text led by one of these words is a statement (no expression starts with them)
_FIRST_WORD = re.compile(r"\s*(?:%s)\b" % "|".join(sorted(
    set(keyword.kwlist) - {"False", "None", "True", "await", "lambda", "not"})))


@functools.lru_cache(maxsize=8192)
def _compiled(source: str, where: str) -> tuple[CodeType, str]:
    """Engine calls repeat across a campaign's programs: compile each text once. With it,
    what the text gives back (Scripted.run): "value" for an expression, "_" for a
    statement that binds `_`, "" for any other."""
    if _FIRST_WORD.match(source) is None:  # (a `with` block, an import: no expression, no try)
        try:  # compiled from the text: building Python's AST objects first would cost twice as much
            return compile(source, where, "eval"), "value"
        except SyntaxError:
            pass
    code = compile(source, where, "exec")
    if "_" not in code.co_names:  # the name is neither read nor bound
        return code, ""
    tree = ast.parse(source, where, "exec")
    binds = any(isinstance(n, ast.Name) and n.id == "_" and isinstance(n.ctx, ast.Store) for n in ast.walk(tree))
    return code, "_" if binds else ""


def import_as(cls: type, alias: str) -> str:
    """The preamble line binding `cls` to `alias`: an import, a load from the file that
    defines it, or a comment where neither finds it (a class made at run time: the
    adapter's `given` binds it instead)."""
    module = sys.modules.get(cls.__module__)
    if getattr(module, cls.__qualname__, None) is cls:
        path = getattr(module, "__file__", "")
        if not getattr(module, "kvoracle_file", False):
            return f"from {cls.__module__} import {cls.__qualname__} as {alias}"
        return (f"from kvoracle.oracle.engines import file_module\n"
                f"{alias} = file_module({str(Path(path).resolve())!r}).{cls.__qualname__}")
    return f"# {alias} is {cls.__module__}.{cls.__qualname__}, which cannot be imported by name: define it here"


def call_starts(adapter: object) -> int:
    """A machine's call into the engine starts: the watchdog times it from now, and the
    answer is the engine calls a Scripted adapter has run so far (0 for any other
    adapter), which the machine notes so that a reproduction knows where the last call begins."""
    watchdog.kick()
    lines = getattr(adapter, "lines", None)
    return len(lines) if isinstance(lines, list) else 0


class Scripted:
    """Runs engine calls from their source text, so that the script an adapter reports
    is exactly what ran, and a shrunk counterexample replays as a standalone file."""

    preamble: str = ""  # imports and construction, run once
    # Set in a replay whose engine may end the process (oracle.survival): the script so far
    # is on disk before each call runs.
    tee: ClassVar[Journal | None] = None

    def __init__(self) -> None:
        self.namespace: dict[str, object] = dict(self.given())
        self.lines: list[str] = []
        if Scripted.tee is not None:
            Scripted.tee.rewrite(self.script())
        exec(_compiled(self.preamble, "<preamble>")[0], self.namespace)
        self.bind()

    def given(self) -> dict[str, object]:
        """Names the preamble finds already bound (override it): a class the preamble
        cannot import, a test's local mutant say, is run as given."""
        return {}

    def bind(self) -> None:
        """Take what the adapter needs from the namespace the preamble built (override it:
        a reproduction file attaches the adapter to its own namespace this way)."""

    @classmethod
    def attach(cls, namespace: dict[str, object]) -> Scripted:
        """The adapter over an engine already built and driven (by a reproduction file)."""
        adapter = cls.__new__(cls)
        adapter.namespace, adapter.lines = namespace, []
        adapter.bind()
        return adapter

    def run(self, statement: str) -> Any:
        """Execute one statement (recorded) and give back its value: an expression's
        (`run("engine.admit('r0', tokens)")`), or what a statement bound to `_`
        (`run("_ = engine.admit('r0', tokens)")`); None for any other statement (engine
        values are untyped here: the adapter knows what its engine returns)."""
        self.lines.append(statement)
        if Scripted.tee is not None:
            Scripted.tee.rewrite(self.script())
        code, gives = _compiled(statement, "<engine call>")
        if gives == "value":
            return eval(code, self.namespace)
        exec(code, self.namespace)
        return self.namespace.get("_") if gives == "_" else None

    def run_bad(self, statement: str) -> None:
        """A bad call. If the engine refuses it by raising, the exception propagates (the
        machine checks the refusal changed nothing). The script keeps the call in a form
        that does not stop a reproduction there, refused or not, so that the same file
        runs on an engine that refuses what this one accepted."""
        try:
            self.run(statement)
        except Exception as e:
            self.lines[-1] = f"with suppress(Exception):  # refused: {repr(e).splitlines()[0]}\n    {statement}"
            raise
        self.lines[-1] = f"with suppress(Exception):  # a bad call, accepted\n    {statement}"

    def script(self) -> list[str]:
        uses = any(line.startswith("with suppress(") for line in self.lines)
        preamble = ("from contextlib import suppress\n" if uses else "") + self.preamble.rstrip()
        return [preamble, *self.lines]
