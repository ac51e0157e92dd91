"""The scheduler adapter Protocol: a serving engine's request lifecycle (submit, schedule,
finish, preempt, abort, time passing) over a tiered cache, with the faults of each
call's storage and swap I/O chosen by the machine (oracle.scheduler_machine).

`state` is the abstraction into spec/'s System and `events` reports the spec actions
each call took, with their choices (spec.scheduler.Event): the machine replays them on
its own record of the specification's state and compares. An engine that cannot map
its state returns None from both, and the machine checks what `observe`, `invariants`
and `content` allow, with liveness judged from its own clock and the transfer ids
`transfers` lists. Requests are spec/ RequestIds; the observations key tables,
`waiting` and `tokens` by "r<id>", and must give `free`. The fault model's vocabulary
(kvcache.faults.Fault) is the design's, shared by every engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvoracle.kvcache.faults import Fault
from kvoracle.oracle.engine import BadInput, Observation
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import Status, System
from kvoracle.spec.types import RequestId


class SchedulerAdapter(Protocol):
    name: str
    block_size: int
    gpu_blocks: int
    cpu_blocks: int
    # ticks of the machine's clock by which every transfer is over, answered or timed out (LIVE-TRANSFER); with
    # events(), a transfer reported timed out must have been in flight that long (spec's complete, REFINEMENT)
    timeout: int
    # Optional: the fault kinds the engine's I/O can suffer (a synchronous engine has no
    # HANG or TWICE); the machine draws only those. Absent: every kind of the fault model.
    # fault_kinds: frozenset[FaultKind]
    # Optional: `prompts`, the family of shared prompts the machine submits (tuples of
    # tokens, each token half a block, as cache_machine.PROMPTS), for an engine whose bugs
    # need longer prompts or deeper shared prefixes than PROMPTS; a request appends up to
    # 3 own tokens. Absent: PROMPTS.
    # prompts: tuple[tuple[int, ...], ...]
    # Optional: `reserve`, GPU blocks of the pool the engine never gives a request (vLLM's
    # null block) or keeps free when it admits: the machine's prompts fit the rest, and
    # LIVE-ADMIT asks an idle engine to admit those that fit there. Absent: 0.
    # reserve: int
    # Optional too: `outcomes() -> Mapping[str, int]`, how the engine's transfers ended so
    # far ("ok", "error", "partial", "timeout"), for an engine that reports no events.
    # Optional: `damage_storage(how: str, i: int) -> None`, for an engine whose storage
    # tier is on files: damage it as oracle.disk.Disk.damage does (`how` one of DAMAGE);
    # such an adapter is driven by the disk machine, which makes these calls between the others.
    # The bad calls it can make, each with the exception the engine must refuse it with.
    refusals: Mapping[BadInput, type[Exception]]

    # --- operations: `faults` are what the I/O calls made during the call do, in order
    def submit(self, r: RequestId, tokens: Sequence[int]) -> None: ...
    def schedule(self, faults: Sequence[Fault]) -> None:
        """One scheduling step: admit, grow and preempt as the engine decides."""
        ...
    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None: ...
    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None: ...
    def abort(self, r: RequestId, faults: Sequence[Fault]) -> None: ...
    def tick(self, n: int) -> None:
        """Time passes: late answers arrive, unanswered transfers time out."""
        ...
    def evict_all(self) -> None:
        """Evict what nothing holds on both tiers, as far as one round goes (GPU eviction
        may swap out to the CPU tier; the machine repeats it while draining)."""
        ...
    def bad_call(self, kind: BadInput) -> bool:
        """Make the bad call, about a request in the state it needs (DUPLICATE_REQUEST:
        any request submitted before, live or ended). False: no such request now,
        nothing was called. The engine's exception propagates."""
        ...

    # --- what the machine asks and checks ----------------------------------------------
    def statuses(self) -> Mapping[RequestId, Status]:
        """Every request ever submitted, ended ones included (bad calls about them)."""
        ...
    def running(self) -> list[RequestId]: ...
    def waiting(self) -> list[RequestId]: ...
    def transfers(self) -> Sequence[object]:
        """The ids of the transfers in flight (answered or not)."""
        ...
    def faults_injected(self) -> int:
        """Faults that I/O calls have actually suffered so far."""
        ...
    def observe(self) -> Observation: ...
    def observe_cpu(self) -> Observation: ...
    def snapshot(self) -> object:
        """Everything comparable, for "a refused call changed nothing" (equality only)."""
        ...
    def state(self) -> System | None:
        """The abstraction: the cache, and each request's status, tokens, computed tokens
        and admissions (the clock is the checker's own)."""
        ...
    def events(self) -> list[Event] | None:
        """The spec actions taken since the last call, in order, with their choices (the
        machine applies the ticks the call let pass first, then these)."""
        ...
    def invariants(self) -> list[Violation]:
        """The cache's invariants and the engine's own structural checks."""
        ...
    def content(self) -> list[Violation]:
        """What spec's INV-CONTENT says of every ready request's blocks (their bytes against its tokens)."""
        ...
