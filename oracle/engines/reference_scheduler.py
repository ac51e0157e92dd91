"""The reference scheduler (scheduler.ResourceManager over kvcache.CacheManager, or a
mutant of either) behind the scheduler Protocol."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from kvoracle.kvcache.abstraction import abstract, audit, snapshot
from kvoracle.kvcache.errors import (
    DuplicateRequest,
    EmptyRequest,
    NotRunning,
    RequestGone,
    RequestTooLarge,
    UnknownRequest,
)
from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool import default_backend
from kvoracle.oracle.disk import Disk
from kvoracle.oracle.engine import NOBODY, BadInput, Observation, Scripted, import_as
from kvoracle.oracle.engines.reference_cache import cpu_observation, gpu_observation
from kvoracle.scheduler.content import content
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import EXITED, Request, Status, System
from kvoracle.spec.types import RequestId



def _turn_about(exited: list[RequestId], finished: list[RequestId]) -> tuple[RequestId, RequestId]:
    """Two exited requests, one finished and one aborted where both kinds exist (which
    comes first turns about with the number exited), else the latest twice."""
    aborted = [r for r in exited if r not in finished]
    if not finished or not aborted:
        return exited[-1], exited[-1]
    pair = (finished[-1], aborted[-1])
    return pair if len(exited) % 2 else (pair[1], pair[0])


def _written(faults: Sequence[Fault]) -> str:
    """Faults as the argument of `plan.injecting`: their words ("raise late(2)"), which
    read as the campaign prints them and compile in about half the time of their reprs,
    where every word gives its fault back; else the list of their reprs."""
    words = list(map(_word, faults))
    return repr(list(faults)) if None in words else repr(" ".join(map(str, words)))


@functools.cache
def _word(f: Fault) -> str | None:
    """f's word where it gives f back, else None (a campaign draws few distinct faults)."""
    word = str(f)
    return word if Fault.parse(word) == f else None


class ReferenceScheduler(Scripted):
    """ResourceManager (or a mutant) over CacheManager, its storage and copier failing as
    each call's faults say, moving real KV bytes (numpy, or KV_BACKEND). Each call runs
    from its source text (oracle.engine.Scripted), so a finding replays as a file."""

    name = "reference"
    scheduler_class: type[ResourceManager] = ResourceManager
    cache_class: type[CacheManager] = CacheManager
    kv_backend = ""  # "": KV_BACKEND from the environment (numpy when unset)
    block_size = 2
    gpu_blocks = 8
    cpu_blocks = 3
    timeout = 4
    write_policy = WritePolicy.ON_FINISH_AND_PREEMPT
    refusals: Mapping[BadInput, type[Exception]] = {
        BadInput.UNKNOWN_REQUEST: UnknownRequest,
        BadInput.DOUBLE_FINISH: RequestGone,
        BadInput.DOUBLE_ABORT: RequestGone,
        BadInput.TOO_LARGE: RequestTooLarge,
        BadInput.DUPLICATE_REQUEST: DuplicateRequest,
        BadInput.EMPTY: EmptyRequest,
        BadInput.PREEMPT_WAITING: NotRunning,
        BadInput.DUPLICATE_BATCH: DuplicateRequest,
    }

    # the backend behind the faults, as source text, and what that text needs imported
    storage = "MemoryStorage()"
    storage_imports = "from kvoracle.kvcache.storage import MemoryStorage"

    def __init__(self) -> None:
        backend = self.kv_backend or default_backend()
        pool = f"make_pool({backend!r}, 'cpu', {{}}, {self.block_size}, 1, 8)"
        self.preamble = "\n".join([
            "from kvoracle.kvcache.faults import Fault, FaultKind, FaultyCopier, FaultyStorage, ScriptedFaults",
            "from kvoracle.kvcache.pool import make_pool",
            self.storage_imports,
            "from kvoracle.oracle.garbage import garbage_in_fresh_and_freed_blocks",
            "from kvoracle.scheduler.content import KVPools",
            "from kvoracle.scheduler.request import WritePolicy",
            import_as(self.scheduler_class, "Scheduler"),
            import_as(self.cache_class, "Cache"),
            "",
            "plan = ScriptedFaults()  # the faults each call's storage and swap I/O suffer",
            f"pools = KVPools({pool.format(self.gpu_blocks)}, {pool.format(self.cpu_blocks)})",
            f"store = {self.storage}",
            f"rm = Scheduler(Cache({self.gpu_blocks}, {self.cpu_blocks}), FaultyStorage(store, plan),",
            f"               FaultyCopier(plan), block_size={self.block_size}, write_policy=WritePolicy.{self.write_policy.name},",
            f"               timeout={self.timeout}, pools=pools)",
            "garbage_in_fresh_and_freed_blocks(rm.cache, pools)  # a block handed out or back holds no prefix's bytes",
        ])
        super().__init__()

    def given(self) -> dict[str, object]:
        return {"Scheduler": self.scheduler_class, "Cache": self.cache_class}

    def bind(self) -> None:
        rm = self.namespace["rm"]
        assert isinstance(rm, ResourceManager)
        self.rm = rm

    def _under(self, faults: Sequence[Fault], call: str) -> None:
        """Run `call` with its I/O suffering `faults` (up to the last real one: after
        it, every call succeeds anyway)."""
        last = max((i for i, f in enumerate(faults) if f.kind is not FaultKind.OK), default=-1)
        if last < 0:
            self.run(call)
        else:
            self.run(f"with plan.injecting({_written(faults[: last + 1])}):\n    {call}")

    def submit(self, r: RequestId, tokens: Sequence[int]) -> None:
        self.run(f"rm.submit({r}, {list(tokens)})")

    def schedule(self, faults: Sequence[Fault]) -> None:
        self._under(faults, "rm.schedule()")

    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None:
        self._under(faults, f"rm.finish({list(batch)})")

    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, f"rm.preempt({r})")

    def abort(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, f"rm.abort({r})")

    def tick(self, n: int) -> None:
        self.run(f"rm.tick({n})")

    def evict_all(self) -> None:
        self.run("rm.evict_all()")

    def bad_call(self, kind: BadInput) -> bool:
        call = self._bad_calls().get(kind)
        if call is None:
            return False
        self.run_bad(call())
        return True

    def _bad_calls(self) -> dict[BadInput, Callable[[], str]]:
        """The bad calls that apply in this state, as source text made when called. A bad
        finish names every running request first: the whole batch must be refused, so
        an engine that finishes the good ones before it meets the bad one is caught."""
        rm = self.rm
        exited = [r for r, q in rm.requests.items() if q.status in EXITED]
        calls: dict[BadInput, Callable[[], str]] = {
            BadInput.UNKNOWN_REQUEST: lambda: f"rm.finish({[*rm.running, NOBODY]})",
            BadInput.TOO_LARGE: lambda: f"rm.submit({NOBODY}, [1] * {rm.cache.gpu.size * self.block_size})",
            BadInput.EMPTY: lambda: f"rm.submit({NOBODY}, [])",
        }
        if exited:  # a finish and an abort each of a finished and of an aborted request, turn about
            gone = _turn_about(exited, [r for r in exited if rm.requests[r].status is Status.FINISHED])
            calls[BadInput.DOUBLE_FINISH] = lambda: f"rm.finish({[*rm.running, gone[0]]})"
            calls[BadInput.DOUBLE_ABORT] = lambda: f"rm.abort({gone[1]})"
        if rm.requests:
            first = next(iter(rm.requests))  # submitted again with its own prompt, as a client's retry
            calls[BadInput.DUPLICATE_REQUEST] = lambda: f"rm.submit({first}, {list(rm.requests[first].tokens)})"
        if rm.waiting:
            calls[BadInput.PREEMPT_WAITING] = lambda: f"rm.preempt({rm.waiting[0]})"
        if rm.running:
            calls[BadInput.DUPLICATE_BATCH] = lambda: f"rm.finish([{rm.running[0]}, {rm.running[0]}])"
        return calls

    def statuses(self) -> dict[RequestId, Status]:
        return {r: q.status for r, q in self.rm.requests.items()}

    def running(self) -> list[RequestId]:
        return list(self.rm.running)

    def waiting(self) -> list[RequestId]:
        return list(self.rm.waiting)

    def transfers(self) -> Sequence[object]:
        return list(self.rm.in_flight())

    def faults_injected(self) -> int:
        return sum(self.rm.storage.injected.values()) + sum(self.rm.copier.injected.values())

    def observe(self) -> Observation:
        rm = self.rm
        return gpu_observation(rm.cache, waiting=frozenset(f"r{r}" for r in rm.waiting),
                               tokens={f"r{r}": len(rm.requests[r].tokens) for r in rm.running})

    def observe_cpu(self) -> Observation:
        return cpu_observation(self.rm.cache)

    def snapshot(self) -> object:
        return snapshot(self.rm.cache), self.statuses()

    def state(self) -> System | None:
        rm = self.rm
        requests = {r: Request(q.status, tuple(q.tokens), len(q.tokens) if q.status is Status.RUNNING else 0,
                               q.admissions) for r, q in rm.requests.items()}
        return System(abstract(rm.cache), requests, self.block_size, self.timeout, rm.now, dict(rm.started))

    def events(self) -> list[Event] | None:
        taken, self.rm.events = self.rm.events, []
        return taken

    def invariants(self) -> list[Violation]:
        return audit(self.rm.cache)  # the machine evaluates spec/ on the abstraction and observations itself

    def content(self) -> list[Violation]:
        rm = self.rm
        assert rm.pools is not None
        ready = [r for r in rm.running if rm.cache.ready(r)]
        return content(rm.cache, rm.pools, {r: (list(rm.cache.table(r)), rm.seeds(r)) for r in ready})


class ReferenceSchedulerOnDisk(ReferenceScheduler):
    """The reference writing through to block files in a directory of its own, which
    the disk damages between calls (oracle.disk): the machine makes `damage_storage`
    calls because this adapter offers them."""

    name = "reference-disk"
    cpu_blocks = 2  # a CPU tier that evictions find full of blocks in transit, so some must drop
    storage = "Disk()"  # DirectoryStorage in a directory of its own
    storage_imports = "from kvoracle.oracle.disk import Disk"

    def damage_storage(self, how: str, i: int) -> None:
        self.run(f"store.damage({how!r}, {i})")

    def content(self) -> list[Violation]:
        """INV-CONTENT of the blocks, and of what each storage write reported written."""
        disk = self.namespace["store"]
        assert isinstance(disk, Disk)
        return super().content() + disk.taken()
