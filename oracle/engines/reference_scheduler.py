"""The reference scheduler (scheduler.ResourceManager over kvcache.CacheManager, or a
mutant of either) behind the scheduler Protocol."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvoracle.kvcache.abstraction import abstract, audit
from kvoracle.kvcache.errors import (
    DuplicateRequest,
    EmptyRequest,
    NotRunning,
    RequestGone,
    RequestTooLarge,
    UnknownRequest,
)
from kvoracle.kvcache.faults import Fault, FaultyCopier, FaultyStorage, ScriptedFaults
from kvoracle.kvcache.manager import CacheManager
from kvoracle.kvcache.pool import default_backend, make_pool
from kvoracle.kvcache.storage import MemoryStorage
from kvoracle.oracle.engine import BadInput, Observation
from kvoracle.oracle.engines.reference_cache import cpu_observation, gpu_observation
from kvoracle.scheduler.content import KVPools, content
from kvoracle.scheduler.request import WritePolicy
from kvoracle.scheduler.resource_manager import ResourceManager
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import Request, Status, System
from kvoracle.spec.types import RequestId


class ReferenceScheduler:
    """ResourceManager (or a mutant) over CacheManager, its storage and copier failing as
    each call's faults say, moving real KV bytes (numpy, or KV_BACKEND)."""

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

    def __init__(self) -> None:
        self.plan = ScriptedFaults()
        backend = self.kv_backend or default_backend()
        pools = KVPools(
            make_pool(backend, "cpu", self.gpu_blocks, self.block_size, 1, 8),
            make_pool(backend, "cpu", self.cpu_blocks, self.block_size, 1, 8),
        )
        self.rm = self.scheduler_class(
            self.cache_class(self.gpu_blocks, self.cpu_blocks),
            FaultyStorage(MemoryStorage(), self.plan),
            FaultyCopier(self.plan),
            block_size=self.block_size,
            write_policy=self.write_policy,
            timeout=self.timeout,
            pools=pools,
        )

    def _under(self, faults: Sequence[Fault], call: Callable[[], object]) -> None:
        for f in faults:
            self.plan.push(f)
        try:
            call()
        finally:
            self.plan.clear()

    def submit(self, r: RequestId, tokens: Sequence[int]) -> None:
        self.rm.submit(r, tokens)

    def schedule(self, faults: Sequence[Fault]) -> None:
        self._under(faults, self.rm.schedule)

    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None:
        self._under(faults, lambda: self.rm.finish(batch))

    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, lambda: self.rm.preempt(r))

    def abort(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._under(faults, lambda: self.rm.abort(r))

    def tick(self, n: int) -> None:
        self.rm.tick(n)

    def evict_all(self) -> None:
        self.rm.evict_all()

    def bad_call(self, kind: BadInput) -> bool:
        call = self._bad_calls().get(kind)
        if call is None:
            return False
        call()
        return True

    def _bad_calls(self) -> dict[BadInput, Callable[[], object]]:
        """The bad calls that apply in this state."""
        rm, nobody = self.rm, RequestId(10**6)
        ended = {s: [r for r, q in rm.requests.items() if q.status is s] for s in (Status.FINISHED, Status.ABORTED)}
        calls: dict[BadInput, Callable[[], object]] = {
            BadInput.UNKNOWN_REQUEST: lambda: rm.finish([nobody]),
            BadInput.TOO_LARGE: lambda: rm.submit(nobody, [1] * rm.cache.gpu.size * self.block_size),
            BadInput.EMPTY: lambda: rm.submit(nobody, []),
        }
        if ended[Status.FINISHED]:
            calls[BadInput.DOUBLE_FINISH] = lambda: rm.finish([ended[Status.FINISHED][0]])
        if ended[Status.ABORTED]:
            calls[BadInput.DOUBLE_ABORT] = lambda: rm.abort(ended[Status.ABORTED][0])
        if rm.requests:
            calls[BadInput.DUPLICATE_REQUEST] = lambda: rm.submit(next(iter(rm.requests)), [1])
        if rm.waiting:
            calls[BadInput.PREEMPT_WAITING] = lambda: rm.preempt(rm.waiting[0])
        if rm.running:
            calls[BadInput.DUPLICATE_BATCH] = lambda: rm.finish([rm.running[0], rm.running[0]])
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
        return replace(
            gpu_observation(rm.cache),
            waiting=frozenset(f"r{r}" for r in rm.waiting),
            tokens={f"r{r}": len(rm.requests[r].tokens) for r in rm.running},
        )

    def observe_cpu(self) -> Observation:
        return cpu_observation(self.rm.cache)

    def snapshot(self) -> object:
        return abstract(self.rm.cache), self.statuses()

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
