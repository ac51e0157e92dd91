"""The resource manager: admit, grow, preempt, finish and abort, over the reference
cache, with storage and swap I/O that may raise, fail, half-succeed, hang or answer
late or twice. Whatever the I/O does, an exiting request's blocks are released in
its exit step (LIVE-EXIT) and every transfer ends within `timeout` ticks (LIVE-TRANSFER).
"""

from __future__ import annotations

import heapq
from itertools import takewhile
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvoracle.kvcache.errors import (
    DuplicateRequest,
    EmptyRequest,
    NotRunning,
    RequestGone,
    RequestTooLarge,
    UnknownRequest,
)
from kvoracle.kvcache.faults import Answer, FaultyCopier, FaultyStorage, Reply, SwapError
from kvoracle.kvcache.manager import CacheManager, MatchReport
from kvoracle.kvcache.transfers import Job, PrefetchJob, SwapInJob, SwapOutJob
from kvoracle.kvcache.storage import StorageError
from kvoracle.scheduler.content import KVPools, block_seeds
from kvoracle.scheduler.request import Request, WritePolicy
from kvoracle.spec.actions import Complete, Evict
from kvoracle.spec.hashing import block_hash
from kvoracle.spec.scheduler import Admit, Decode, Event, Exit, Insert, Prefill, Submit
from kvoracle.spec.state import EXITED, Status
from kvoracle.spec.types import BlockHash, Error, GpuBlock, Outcome, RequestId, Timeout, TransferId, succeeded


@dataclass
class Stats:
    admitted: int = 0
    preempted: int = 0
    finished: int = 0
    aborted: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0  # matched on GPU, or being swapped in or prefetched
    stale_answers: int = 0  # late or duplicate answers, recognised and ignored
    timeouts: int = 0
    io_raised: int = 0
    block_ops: int = 0
    log: list[str] = field(default_factory=list)


def payload(h: BlockHash) -> bytes:
    """What a storage write carries for a block: its name, until a block pool supplies KV bytes."""
    return h.to_bytes(8, "little")


class ResourceManager:
    def __init__(
        self,
        cache: CacheManager,
        storage: FaultyStorage,
        copier: FaultyCopier,
        *,
        block_size: int,
        write_policy: WritePolicy = WritePolicy.ON_FINISH,
        timeout: int = 4,
        pools: KVPools | None = None,
    ) -> None:
        if block_size < 1 or timeout < 1:
            raise ValueError(f"block_size and timeout must be >= 1, got {block_size} and {timeout}")
        self.cache = cache
        self.storage = storage
        self.copier = copier
        self.block_size = block_size
        self.write_policy = write_policy
        self.timeout = timeout
        self.requests: dict[RequestId, Request] = {}
        self.waiting: deque[RequestId] = deque()
        self.running: list[RequestId] = []  # admission order
        self.now = 0
        self.started: dict[TransferId, int] = {}
        self._answers: list[tuple[int, int, TransferId, Outcome]] = []
        self._seq = 0
        self._admissions = 0
        self.stats = Stats()
        self.pools = pools  # when set, every copy the lifecycle implies moves real bytes
        self._reads: dict[TransferId, list[bytes]] = {}  # prefetched data awaiting its answer
        self.events: list[Event] = []  # every spec action taken, with its choices (refinement replays them)

    # --- bookkeeping helpers --------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def hashes(self, r: RequestId) -> tuple[BlockHash, ...]:
        """Chained hashes of r's full blocks, extended as decode fills blocks."""
        req = self.requests[r]
        full = len(req.tokens) // self.block_size
        while len(req.hashes) < full:
            i = len(req.hashes)
            parent = req.hashes[-1] if req.hashes else None
            req.hashes.append(block_hash(parent, req.tokens[i * self.block_size : (i + 1) * self.block_size]))
        return tuple(req.hashes[:full])

    def seeds(self, r: RequestId) -> list[int]:
        """The content seed of each position of r's table (see scheduler/content.py)."""
        req = self.requests[r]
        return block_seeds(req.tokens, self.hashes(r), self.block_size, req.blocks)

    def _fill(self, r: RequestId, positions: Sequence[int]) -> None:
        """Compute (prefill or recompute) the KV data of these table positions."""
        if self.pools is None or not positions:
            return
        table, seeds = self.cache.table(r), self.seeds(r)
        self.pools.gpu.fill([table[i] for i in positions], [seeds[i] for i in positions])

    def _known(self, r: RequestId) -> Request:
        req = self.requests.get(r)
        if req is None:
            raise UnknownRequest(r, "was never submitted")
        return req

    # --- submit ----------------------------------------------------------------------

    def submit(self, r: RequestId, tokens: Sequence[int]) -> Request:
        if r in self.requests:
            raise DuplicateRequest(r)
        if not tokens:
            raise EmptyRequest(r)
        if self.blocks_for(len(tokens) + 1) > self.cache.gpu.size:
            raise RequestTooLarge(r, self.blocks_for(len(tokens) + 1), self.cache.gpu.size)
        req = Request(r, list(tokens))
        self.requests[r] = req
        self.waiting.append(r)
        self.events.append(Submit(r, tuple(tokens)))
        return req

    # --- schedule --------------------------------------------------------------------

    def schedule(self) -> list[RequestId]:
        """One scheduler step: commit what prefill made, decode a token for each ready
        running request (growing, evicting, preempting as needed), then admit waiting
        requests in order. Returns the requests admitted."""
        for r in list(self.running):
            if self.cache.ready(r):
                full = self.hashes(r)[: self.requests[r].blocks]
                self.cache.commit(r, full)
                self.events.append(Insert(r, len(full)))
        for r in list(self.running):
            if r in self.running and self.cache.ready(r):
                self._decode(r)
        admitted: list[RequestId] = []
        while self.waiting and self._admit(self.waiting[0]):
            admitted.append(self.waiting.popleft())
        return admitted

    def _decode(self, r: RequestId) -> None:
        req = self.requests[r]
        if len(req.tokens) + 1 > req.blocks * self.block_size:
            if not self._reserve(1, r):
                return  # r itself was preempted to make room
            grown = tuple(self.cache.allocate(r, 1))
            req.blocks += 1
            self.stats.block_ops += 1
        else:
            grown = ()
        req.tokens.append(1 + (len(req.tokens) + r) % 2)
        self.events.append(Decode(r, req.tokens[-1], grown))
        self._fill(r, [req.blocks - 1])  # the last block now holds one more token

    def _reserve(self, need: int, grower: RequestId) -> bool:
        """Make `need` GPU blocks free for `grower`: evict, then preempt running
        requests, last admitted first. False when `grower` itself had to go."""
        while self.cache.gpu.num_free < need:
            if self._evict(need - self.cache.gpu.num_free):
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim == grower:
                return False
        return True

    def _evict(self, need: int) -> bool:
        """Start evicting; True when that freed or will free anything."""
        rep = self.cache.evict_gpu(need)
        self.stats.block_ops += len(rep.steps)
        if rep.steps:
            self.events.append(Evict(rep.steps))
        if rep.swap_out is not None:
            n = len(self.cache.jobs[rep.swap_out].items)
            self._start(rep.swap_out, lambda: self.copier.copy("swap_out", n))
            if self.cache.gpu.num_free < need:
                self.tick(0)
        return bool(rep.steps)

    def _admit(self, r: RequestId) -> bool:
        """All or nothing: either r is running with its whole table, or nothing changed for r."""
        req = self.requests[r]
        hashes = self.hashes(r)
        blocks = self.blocks_for(len(req.tokens))
        for _ in range(3):  # eviction can remove part of r's own cached prefix: look again
            need = blocks - self.cache.gpu_hits(hashes)
            short = need - self.cache.gpu.num_free
            if short <= 0 or not self._evict(short):
                break
        need = blocks - self.cache.gpu_hits(hashes)
        if not self._fits(need):
            return False
        rep = self.cache.match(r, hashes, limit=need)
        self.cache.allocate(r, blocks - len(self.cache.table(r)))
        self._started_running(req, blocks, rep)
        self._fill(r, range(rep.hits, blocks))  # prefill what no tier had
        self._start_fills(r, rep)
        return True

    def _fits(self, need: int) -> bool:
        """The GPU can take `need` new blocks now."""
        return need <= self.cache.gpu.num_free

    def _started_running(self, req: Request, blocks: int, rep: MatchReport) -> None:
        self.events.append(Admit(req.id, rep.swap_dests, rep.prefetch_dests))
        rest = len(req.tokens) - min(len(req.tokens), rep.hits * self.block_size)
        if rest:
            self.events.append(Prefill(req.id, rest, tuple(self.cache.table(req.id)[rep.hits:])))
        req.status = Status.RUNNING
        req.blocks = blocks
        req.admitted_at = self._admissions
        req.admissions += 1
        self._admissions += 1
        self.running.append(req.id)
        self.stats.admitted += 1
        self.stats.prompt_blocks += len(self.hashes(req.id))
        self.stats.hit_blocks += rep.hits
        self.stats.block_ops += blocks - rep.gpu_hits

    def _start_fills(self, r: RequestId, rep: MatchReport) -> None:
        if rep.swap_in is not None:
            n = len(rep.swap_dests)
            self._start(rep.swap_in, lambda: self.copier.copy("swap_in", n))
        if rep.prefetch is not None:
            job = self.cache.jobs[rep.prefetch]
            assert isinstance(job, PrefetchJob)
            wanted = [h for h, _ in job.items]
            self._start(rep.prefetch, lambda: self._read(job.id, wanted))

    def _read(self, t: TransferId, wanted: list[BlockHash]) -> Reply:
        reply, data = self.storage.read(wanted)
        self._reads[t] = data
        return reply

    # --- exits -----------------------------------------------------------------------

    def finish(self, batch: Sequence[RequestId]) -> None:
        """Finish running requests. The batch is validated first (bad input changes
        nothing); then each is written (per policy) and released, independently."""
        for r in batch:
            self._check_running(r)
        if len(set(batch)) != len(batch):
            raise DuplicateRequest(next(r for r in batch if list(batch).count(r) > 1))
        for r in batch:
            self._exit(r, Status.FINISHED)

    def abort(self, r: RequestId) -> None:
        req = self._known(r)
        if req.status in EXITED:
            raise RequestGone(r, req.status.value)
        self._exit(r, Status.ABORTED)

    def preempt(self, r: RequestId) -> None:
        self._check_running(r)
        self._exit(r, Status.PREEMPTED)

    def _check_running(self, r: RequestId) -> None:
        req = self._known(r)
        if req.status in EXITED:
            raise RequestGone(r, req.status.value)
        if req.status is not Status.RUNNING:
            raise NotRunning(r, req.status.value)

    def _exit(self, r: RequestId, to: Status) -> None:
        req = self.requests[r]
        write = self.hashes(r)[: req.blocks] if self.write_policy.writes_on(to) else ()
        self._release(r, to, write)

    def _release(self, r: RequestId, to: Status, write: Sequence[BlockHash]) -> None:
        """The exit itself: release first (blocks a write still reads pass to it), then
        start the write, whose failure can no longer keep anything."""
        req = self.requests[r]
        if req.status is Status.RUNNING:
            rep = self.cache.release(r, write)
            self.events.append(Exit(r, to, rep.writes))
            self.running.remove(r)
            if rep.write is not None:
                items = self._payloads(rep.writes)
                self._start(rep.write, lambda: self.storage.write(items))
        else:
            self.waiting.remove(r)
            self.events.append(Exit(r, to))
        req.status = to
        if to is Status.PREEMPTED:
            req.preemptions += 1
            self.stats.preempted += 1
            self.waiting.appendleft(r)  # never lost: first in line again
        elif to is Status.FINISHED:
            self.stats.finished += 1
        else:
            self.stats.aborted += 1

    def _payloads(self, writes: Sequence[tuple[BlockHash, GpuBlock]]) -> list[tuple[BlockHash, bytes]]:
        if self.pools is None:
            return [(h, payload(h)) for h, _ in writes]
        return [(h, self.pools.gpu.read(g)) for h, g in writes]

    # --- transfers: start, answers, timeouts ---------------------------------------------

    def _start(self, t: TransferId, io: Callable[[], Reply]) -> None:
        """Issue the I/O of transfer t. A raise is an error answer, delivered now."""
        self.started[t] = self.now
        try:
            reply = io()
        except (StorageError, SwapError) as e:
            self.stats.io_raised += 1
            self.stats.log.append(f"transfer {t}: {e}")
            reply = (Answer(0, Error()),)
        for answer in reply:
            if answer.delay == 0:
                self._deliver(t, answer.outcome)
            else:
                self._seq += 1
                heapq.heappush(self._answers, (self.now + answer.delay, self._seq, t, answer.outcome))

    def _deliver(self, t: TransferId, outcome: Outcome) -> None:
        """An answer arrives. One for a transfer that already ended (late, duplicate, or
        after its timeout) is recognised and ignored: it touches no block."""
        job = self.cache.jobs.get(t)
        if job is None:
            self.stats.stale_answers += 1
            return
        done = succeeded(outcome, len(job.items))
        arrived = self._move(job, done)
        self.cache.complete(t, outcome)
        self.events.append(Complete(t, outcome))
        self.started.pop(t, None)
        self._reads.pop(t, None)
        if isinstance(job, SwapInJob | PrefetchJob) and job.request is not None and arrived < len(job.items):
            self._recompute(job.request, {g for *_, g in job.items[arrived:]})

    def _move(self, job: Job, done: int) -> int:
        """Copy the bytes of the items the answer says arrived; returns how many landed
        (a prefetched payload of the wrong size ends the run: it is recomputed)."""
        p = self.pools
        if p is None or done == 0:
            return done
        if isinstance(job, SwapOutJob):
            p.gpu.copy_to(p.cpu, [g for _, g, _ in job.items[:done]], [c for *_, c in job.items[:done]])
        elif isinstance(job, SwapInJob):
            p.cpu.copy_to(p.gpu, [c for _, c, _ in job.items[:done]], [g for *_, g in job.items[:done]])
        elif isinstance(job, PrefetchJob):
            data = list(takewhile(lambda d: len(d) == p.gpu.block_bytes, self._reads.get(job.id, [])[:done]))
            p.gpu.write([g for _, g in job.items[: len(data)]], data)
            return len(data)
        return done

    def _recompute(self, r: RequestId, failed: set[GpuBlock]) -> None:
        """Blocks a swap-in or prefetch did not fill are computed again."""
        self._fill(r, [i for i, g in enumerate(self.cache.table(r)) if g in failed])

    def tick(self, n: int = 1) -> None:
        """Advance time by n ticks (0: only deliver what is due now), then time out
        every transfer that has run for `timeout` ticks."""
        self.now += n
        while self._answers and self._answers[0][0] <= self.now:
            _, _, t, outcome = heapq.heappop(self._answers)
            self._deliver(t, outcome)
        self._expire()

    def _expire(self) -> None:
        for t, began in sorted(self.started.items()):
            if self.now - began >= self.timeout and t in self.cache.jobs:
                self.stats.timeouts += 1
                self._deliver(t, Timeout())

    def evict_all(self) -> None:
        """Evict what nothing holds on both tiers, as far as one round goes."""
        rep = self.cache.evict_cpu(self.cache.cpu.size)
        if rep.steps:
            self.events.append(Evict(rep.steps))
        self._evict(self.cache.gpu.size)

    def in_flight(self) -> list[TransferId]:
        return self.cache.in_flight()
