"""vLLM's full v1 Scheduler and KVCacheManager with a KV connector kvoracle controls,
behind the scheduler Protocol (oracle.serving), for the releases 0.12.0 .. 0.34.0 (kvoracle's own
connector; each of the others from its own first release).

The adapter plays EngineCore and the worker side of the connector; vLLM's own code is
the Scheduler, its KVCacheManager and BlockPool, and (where a row uses one) the scheduler
side of a real connector. Three connectors:

- "kvoracle": a connector of kvoracle's own (the preamble's KvoracleConnector, loaded
  through `kv_connector_module_path`): every new request's prompt is an asynchronous load
  (a remote prefill: get_num_new_matched_tokens answers `(n, True)`), and every finished
  request's KV is sent before its blocks are freed (request_finished answers True);
- "mooncake": vLLM's MooncakeStoreConnector (0.21.0+), its lookup client (a ZMQ client to
  the workers) replaced by kvoracle's store index; the store jobs of each step's connector
  metadata are run by kvoracle's worker, and lookups hit what completed jobs stored, which
  starts loads;
- "offload": vLLM's OffloadingConnector with its CPU tier (CPUOffloadingSpec, LRU or ARC);
  the stores and loads of each step's metadata run by kvoracle's worker, which ends a
  preempted request's stores at once (OffloadingConnectorWorker.handle_preemptions waits
  for them before the next forward); the CPU tier is observed. Two layouts, picked by the
  installed release: 0.15 .. 0.20 (reqs_to_store / reqs_to_load, completions by request:
  a finished request's free waits for its stores), and 0.21+ (vLLM PR 39186: load and
  store jobs by id, completions in OffloadingWorkerMetadata.completed_jobs, a load's also
  by its request's finished_recving; a finished request's blocks are freed at once and
  fenced while its store jobs read them: handing one out again puts the jobs in
  jobs_to_flush, which the worker waits for before the forward). Two CPU tiers: up to 0.18
  an LRU/ARC manager over a CPUBackend, from 0.19 a CPUOffloadingManager with a CachePolicy
  (vLLM PR 37874). Run on 0.18.0, 0.20.2, 0.26.0 and 0.29.0+; 0.19, 0.21 .. 0.25, 0.27 and
  0.28 are driven as their changelogs place them, not run.

The engine the adapter plays (the preamble's functions; vLLM's own in brackets):

submit   = add_request [EngineCore.add_request]
schedule = one engine step, if the engine would step (Scheduler.has_requests(); a "busy"
           row steps regardless, as other traffic would make it): schedule(); the worker
           runs the step's transfers; update_from_output with one sampled token per request
           whose prefill is complete and the step's KVConnectorOutput [EngineCore.step].
           With async scheduling, EngineCore.step_with_batch_queue (two steps in flight):
           the KVConnectorOutput is made when the worker runs the step (what ended by then,
           the jobs that step flushed included) and reaches the scheduler with that step's
           model output, after the next schedule()
finish   = finish_requests(FINISHED_STOPPED); abort = finish_requests(FINISHED_ABORTED)
           [EngineCore.abort_requests, the output processor's stop strings]
preempt  = what schedule() does to the request it preempts when blocks run short:
           running.remove, then Scheduler._preempt_request (0.29+: with drop_stale_output
           as schedule() passes it) [the preemption loop of
           Scheduler.schedule; reset_prefix_cache(reset_running_requests=True) makes the same
           call for every running request]. As after vLLM's own preemption, the request is
           not resumed by the schedule() that reports it (it waits out one schedule());
           releases before 0.27 report it in that SchedulerOutput's preempted_req_ids (the
           adapter adds it, as 0.27+ does itself with reset_preempted_req_ids)
tick(n)  = n engine steps with nothing submitted (where vLLM would step)
evict_all= BlockPool.evict_blocks of every cached block on the free queue (vLLM evicts
           lazily, when get_new_blocks reuses one); the CPU tier's idle blocks likewise

Faults. Each I/O call of a step (a load started at update_state_after_alloc, a store job
in the step's connector metadata, a send or store started by request_finished) takes the
next fault of the call's faults, in order, and kvoracle's worker answers it that way: OK
at the next step; ERROR (and RAISE, where the I/O runs on the worker: vLLM's worker-side
connectors catch their transfer errors) reports a load's blocks invalid together with its
finished_recving (the connector contract), a store or send as ended; PARTIAL(k) invalidates
the blocks after the first k; HANG never answers (vLLM's scheduler has no timeout: a
connector that never reports keeps the blocks); LATE(d) answers d steps later; TWICE
answers at the next step and the transport's second answer, d steps later, is dropped by
the worker (worker-side connectors report a transfer they still hold, once). RAISE on
request_finished makes that call raise (a storage write that raises at exit); a request
with no blocks to send makes no I/O there.

Observations: GPU block ids 1..N-1 (block 0 is vLLM's null block); free = the free queue's
blocks without a hash, cached = blocks with a hash; tables = live requests' block tables;
pinned = blocks an in-flight load writes or an in-flight store, send or (async, KV
consumer) model step reads, except where the transfer's own request lists the block;
in_flight = uncached blocks vLLM holds for an in-flight transfer that no table lists (a
fenced block on the free queue, 0.21+ offloading, is the store's: neither free nor
evictable);
refcounts = ref_cnt less the references vLLM holds for transfers. A request vLLM has
marked finished but whose exit raised before its free (request_finished raised) has not
exited: it keeps its status and table, which is what LIVE-EXIT judges. A request holding
blocks while it waits (WAITING_FOR_REMOTE_KVS) counts as admitted (running), as spec's
admit with a prefetch in flight does. observe_cpu: the offloading connector's CPU tier
(else an empty tier), with the tree its lookups walk (see observe_cpu), and where its
manager keeps them (0.26.0 and 0.29+; not 0.20.2) its counters of idle and write-pending
chunks, recounted.

Importing this module does not import vLLM.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from kvoracle.kvcache.faults import Fault, FaultKind
from kvoracle.oracle.engine import BadInput, Observation, Scripted
from kvoracle.oracle.engines import require_release
from kvoracle.spec.invariants import Violation
from kvoracle.spec.scheduler import Event
from kvoracle.spec.state import EXITED, Status, System
from kvoracle.spec.types import RequestId

OLDEST, NEWEST = (0, 15, 1), (0, 34, 0)
# The classes on kvoracle's own connector drive from 0.12.0, where Scheduler._preempt_request
# came (0.11.2 preempts inline in schedule(): the adapter's preempt has nothing to call).
OWN_CONNECTOR_OLDEST = (0, 12, 0)
# The offloading connector's releases (offload_layout picks the preamble's texts from these):
# vLLM PR 37874 (0.19.0) made the CPU tier one CPUOffloadingManager with a pluggable CachePolicy
# (LRU or ARC) over a pool of its own, in place of LRUOffloadingManager / ARCOffloadingManager
# over a CPUBackend; vLLM PR 39186 (0.21.0, "per-job store completion") keys loads and stores by
# job id and reports their completions in OffloadingWorkerMetadata, not by request.
POLICY_FROM = (0, 19, 0)  # the CPU tier's CachePolicy (PR 37874)
JOBS_FROM = (0, 21, 0)  # the offloading connector's transfer jobs by id (PR 39186)
IDLE_STEPS_FROM = (0, 22, 0)  # EngineCore steps while a delayed free is pending (PR 43433)
FINISHED_ERROR_FROM = (0, 13, 0)  # RequestStatus.FINISHED_ERROR
# BlockPool.evict_blocks(block_ids) came in 0.13.0 (for KV connectors); before it, evicting a
# cached block is what that method runs for each id, BlockPool._maybe_evict_cached_block.
EVICT_BLOCKS_FROM = (0, 13, 0)


def evict_cached(vllm: tuple[int, ...]) -> str:
    """Script text for release `vllm`: `evict_cached(ids)` evicts those cached blocks of
    the script's `pool` (both vLLM adapters' preambles hold it)."""
    if vllm >= EVICT_BLOCKS_FROM:
        return "\n\ndef evict_cached(ids):\n    pool.evict_blocks(set(ids))\n"
    return ("\n\ndef evict_cached(ids):  # what evict_blocks runs for each id (EVICT_BLOCKS_FROM)\n"
            "    for b in ids:\n        pool._maybe_evict_cached_block(pool.blocks[b])\n")


# vLLM on the CPU platform, whatever the build: releases before 0.2x pick it only for a "+cpu"
# build of vLLM, and releases <= 0.17 probe a torch function 2.13 dropped. Shared by both vLLM
# adapters' preambles (after VLLM_TARGET_DEVICE is set).
CPU_PLATFORM = """\
import torch
import vllm.platforms as _platforms
if type(_platforms.current_platform).__name__ == "UnspecifiedPlatform":
    from vllm.platforms.cpu import CpuPlatform
    _platforms._current_platform = CpuPlatform()
if not hasattr(torch._C._cpu, "_is_avx512_supported"):
    torch._C._cpu._is_avx512_supported = lambda: False
"""

HEAD = """\
import inspect, json, logging, os, sys, tempfile, time, types
from collections import Counter, deque
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM first looks for a platform
os.environ.update(HF_HUB_OFFLINE="1")
logging.getLogger("vllm").setLevel(logging.CRITICAL)  # its notes and its own errors, at every step
import torch
import vllm
logging.getLogger("vllm").setLevel(logging.CRITICAL)
""" + CPU_PLATFORM + """
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
try:
    from vllm.utils.hashing import sha256
except ImportError:
    from vllm.utils import sha256
"""

# SchedulerConfig's extra arguments: releases that take is_encoder_decoder are told the model
# is decoder-only. Shared by both vLLM adapters' preambles; needs inspect and SchedulerConfig imported.
DECODER_ONLY = """\
_decoder_only = {"is_encoder_decoder": False} if "is_encoder_decoder" in inspect.signature(SchedulerConfig).parameters else {}
"""

# A Request's extra arguments: up to 0.17 it takes eos_token_id, a required argument (None: no
# end-of-sequence token). Shared by both vLLM adapters' preambles; needs inspect and Request imported.
REQUEST_ARGS = """\
_request_args = {"eos_token_id": None} if "eos_token_id" in inspect.signature(Request).parameters else {}
"""

# An engine on the CPU: the tiny model (a Llama config.json, no weights, no tokenizer, in one
# folder that every engine process shares, written whole and renamed into place so that no
# process reads half of it), its VllmConfig, and what its model runner returns (`cpu_engine`
# puts the release's gates before it).
CPU_ENGINE = """
model = os.path.join(tempfile.gettempdir(), "kvoracle-tiny-llama")
os.makedirs(model, exist_ok=True)
with tempfile.NamedTemporaryFile("w", dir=model, suffix=".part", delete=False) as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
               "num_hidden_layers": 1, "vocab_size": 1000, "max_position_embeddings": 256,
               "rms_norm_eps": 1e-5, "torch_dtype": "float16"}, f)
os.replace(f.name, os.path.join(model, "config.json"))


def cpu_vllm_config(**parts):
    # TRITON_REQUIRED: the release refuses an x86 CPU without Triton, which only its model
    # runner needs (none runs here): while the config is checked, Triton counts as present.
    if not TRITON_REQUIRED:
        return VllmConfig(**parts)
    import vllm.triton_utils as triton_utils
    had, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
    try:
        return VllmConfig(**parts)
    finally:
        triton_utils.HAS_TRITON = had


def runner_output(ids, sampled):
    # What the model runner returns for the scheduled requests `ids` (0.34 dropped
    # req_id_to_index: a request's index is its place in req_ids; RUNNER_DEFAULTS and
    # LIST_TOKENS: the gates of the same names).
    from vllm.v1.outputs import ModelRunnerOutput
    if not RUNNER_DEFAULTS:
        if not LIST_TOKENS:
            import numpy
            sampled = [numpy.array(tokens, dtype=numpy.int64) for tokens in sampled]
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[])
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled)
"""

# What CPU_ENGINE's functions do by release, read in the wheels on both sides of each.
TRITON_REQUIRED_FROM = (0, 34, 0)  # VllmConfig refuses an x86 CPU without Triton
RUNNER_DEFAULTS_FROM = (0, 14, 0)  # ModelRunnerOutput defaults logprobs, prompt_logprobs_dict, pooler_output
LIST_TOKENS_FROM = (0, 12, 0)  # a request's sampled tokens are a list (a numpy array before)


def cpu_engine(vllm: tuple[int, ...]) -> str:
    """CPU_ENGINE for release `vllm`, its gates first (both vLLM adapters' preambles hold it)."""
    return (f"TRITON_REQUIRED, RUNNER_DEFAULTS, LIST_TOKENS = {vllm >= TRITON_REQUIRED_FROM}, "
            f"{vllm >= RUNNER_DEFAULTS_FROM}, {vllm >= LIST_TOKENS_FROM}\n") + CPU_ENGINE


# The block hasher and the KV cache's layout, sized by hand.
CONFIG = """
init_none_hash(sha256)
hasher = get_request_block_hasher(B, sha256)
layer = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=8, dtype=torch.float16)
tensors = []
CHUNK = layer.page_size_bytes  # bytes of one CPU block (0.29+: rounded up to a page)
if CONNECTOR == "offload":  # the CPU tier is sized from the GPU tensors' layout
    try:
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
        align = getattr(CPUOffloadingSpec, "BLOCK_SIZE_ALIGNMENT", 1)
    except ImportError:  # before 0.2x the spec is a module of its own, unaligned
        align = 1
    CHUNK = -(-CHUNK // align) * align
    size = layer.page_size_bytes * N
    try:
        tensors = [KVCacheTensor(size=size, shared_by=["layer.0"])]
    except TypeError:  # 0.29+: an explicit layout
        tensors = [KVCacheTensor(size=size, layers=["layer.0"], layer_stride=size, block_stride=layer.page_size_bytes)]
kv_cache_config = KVCacheConfig(num_blocks=N, kv_cache_tensors=tensors, kv_cache_groups=[KVCacheGroupSpec(["layer.0"], layer)])
cache_config = CacheConfig(block_size=B, enable_prefix_caching=True)
cache_config.num_gpu_blocks = N
""" + DECODER_ONLY + """
scheduler_args = dict(max_num_batched_tokens=BATCH, max_num_seqs=MAX_SEQS, max_model_len=MAX_LEN,
                      disable_hybrid_kv_cache_manager=True, **_decoder_only)
if CONNECTOR == "kvoracle":
    transfer = KVTransferConfig(kv_connector="KvoracleConnector", kv_connector_module_path="kvoracle_vllm_connector",
                                kv_role=ROLE)
elif CONNECTOR == "mooncake":
    transfer = KVTransferConfig(kv_connector="MooncakeStoreConnector", kv_role=ROLE,
                                kv_connector_extra_config={"load_async": True})
else:  # OFFLOAD: (CPU blocks, eviction policy)
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role=ROLE, kv_connector_extra_config={
        "cpu_bytes_to_use": OFFLOAD[0] * CHUNK, "eviction_policy": OFFLOAD[1]})
vllm_config = cpu_vllm_config(
    model_config=ModelConfig(model=model, skip_tokenizer_init=True, max_model_len=MAX_LEN, dtype="float16"),
    cache_config=cache_config, scheduler_config=SchedulerConfig(**scheduler_args), kv_transfer_config=transfer)
if ASYNC:  # the CPU platform switches async scheduling off; a GPU deployment has it on
    vllm_config.scheduler_config.async_scheduling = True
"""

# The scheduler side of kvoracle's own connector, importable before the config is made
# (0.34 looks the connector class up while building VllmConfig).
CONNECTOR_CLASS = '''

class KvoracleConnector(KVConnectorBase_V1):
    """The scheduler side of a connector kvoracle controls: remote prefills (every new
    request's full prompt blocks are loaded asynchronously) and sends (a finished
    request's blocks are read before they are freed)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:
            super().__init__(vllm_config, role)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = request.request_id
        if not LOADS or rid in W.asked:
            return 0, False
        W.asked.add(rid)
        hit = (request.num_tokens - 1) // B * B  # full blocks; the last token is computed here
        return (hit - num_computed_tokens, True) if hit > num_computed_tokens else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens > 0:
            fresh = [b.block_id for b in blocks.blocks[0] if b.block_hash is None and not b.is_null]
            W.start("load", request.request_id, fresh[: num_external_tokens // B])

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        rid = request.request_id
        blocks = [b for b in block_ids if b]
        if not SENDS or not blocks or W.of(rid, "load"):  # nothing to send: no I/O
            return False, None
        f = W.fault()
        if f[0] == "raise":
            W.cut_short.add(rid)
            W.ended["error"] += 1
            raise StorageError(f"the KV send of {rid} failed")
        W.start("send", rid, blocks, fault=f)
        return True, None

    # the worker role is never built here
    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


_module = types.ModuleType("kvoracle_vllm_connector")
_module.KvoracleConnector = KvoracleConnector
sys.modules["kvoracle_vllm_connector"] = _module
'''

WORKER = '''

# --- kvoracle's side: the worker that runs the connector's transfers, as each fault says ---
class StorageError(RuntimeError):
    """What request_finished raises under a RAISE fault."""


class Transfer:
    def __init__(self, tid, kind, req, blocks, fault, due, key=None, hashes=()):
        self.id, self.kind, self.req, self.blocks, self.fault = tid, kind, req, list(blocks), fault
        self.due, self.key, self.hashes = due, key, list(hashes)

    def __repr__(self):
        return f"{self.kind} {self.id} of {self.req}"


class Worker:
    """Runs every load, store and send the connector's scheduler side starts, and reports
    each to the scheduler (KVConnectorOutput) when its fault says, the way vLLM's worker
    side does: loads by finished_recving (failed blocks in invalid_block_ids with it),
    sends by finished_sending, store jobs by job id where the connector has one, else by
    finished_sending once a finished request has no job left."""

    def __init__(self):
        self.now = 0  # engine steps so far
        self.plan = []  # the faults the I/O calls of the call in progress suffer, in order
        self.live = {}  # transfer id -> Transfer, not yet reported to the scheduler
        self.n = 0
        self.ended = Counter()  # outcome -> transfers
        self.started = Counter()  # kind -> transfers
        self.injected = 0
        self.cut_short = set()  # requests whose request_finished raised
        self.stored = set()  # block hashes the store holds (lookups hit them)
        self.asked = set()  # requests whose external hit was asked for
        self.keyed_by_request = False  # store jobs end by finished_sending of their request
        self.waited = []  # (transfer, failed items) the worker waited for: reported with the step's output
        self.unheard = {}  # transfer id -> Transfer the worker reported in a step output not yet processed

    def fault(self):
        f = self.plan.pop(0) if self.plan else ("ok", 0, 0)
        if f[0] != "ok":
            self.injected += 1
        return f

    def start(self, kind, req, blocks, key=None, hashes=(), fault=None):
        f = self.fault() if fault is None else fault
        due = None if f[0] == "hang" else self.now + (max(1, f[2]) if f[0] == "late" else 1)
        t = Transfer(self.n, kind, req, blocks, f, due, key, hashes)
        self.started[kind] += 1
        self.n += 1
        self.live[t.id] = t
        return t

    def of(self, req, kind=None):
        return [t for t in self.live.values() if t.req == req and kind in (None, t.kind)]

    def answers(self):
        """The transfers whose answer is due, taken out of flight, with the items that failed.
        A release (a finished request's free waiting for its store jobs, where jobs are
        reported by request) answers once the request has no store job left."""
        out = []
        due = sorted((t for t in self.live.values() if t.due is not None and t.due <= self.now),
                     key=lambda t: (t.kind == "release", t.id))
        for t in due:
            if t.kind == "release" and self.of(t.req, "store"):
                continue
            out.append((t, self.end(t)))
        return out

    def end(self, t):
        """Take a transfer out of flight as its fault says; the items that failed."""
        del self.live[t.id]
        kind, done, _ = t.fault
        if kind in ("error", "raise"):
            bad = list(t.blocks)
        elif kind == "partial":
            bad = t.blocks[done:]
        else:
            bad = []
        if t.kind != "release":
            self.ended["ok" if not bad else "partial" if kind == "partial" else "error"] += 1
        if t.kind == "store":
            good = len(t.hashes) if not bad else (done if kind == "partial" else 0)
            self.stored.update(t.hashes[:good])
        return bad

    def note_delayed(self):
        """Where store jobs are reported by request, a finished request vLLM keeps (its
        connector delayed the free) is released by the worker's finished_sending once its
        jobs are done: a transfer of its own, with no I/O."""
        if not self.keyed_by_request:
            return
        for rid, req in sched.requests.items():
            if req.is_finished() and rid not in self.cut_short and not self.of(rid):
                self.start("release", rid, [], fault=("ok", 0, 0))

    def wait(self, t):
        """End a transfer the worker waits for before the forward, whatever its fault
        says (it does not hang the step); reported with the step's output."""
        self.waited.append((t, self.end(t)))

    def pending(self):
        """The transfers vLLM's scheduler has not heard the end of: still running, or reported
        in a step's output it has not processed yet (async scheduling). (The jobs waited for
        at a preemption are reported by the next step's output; they read no block by then.)"""
        return list(self.live.values()) + list(self.unheard.values())

    def heard(self, ids):
        """The scheduler processed the output that reported the transfers ids."""
        for i in ids:
            self.unheard.pop(i, None)

    def report(self):
        """The KVConnectorOutput a worker attaches to the model output of the step it runs
        now, and the ids of the transfers it reports: the scheduler hears of them when it
        processes that output (with async scheduling, after it schedules the next step)."""
        recving, sending, invalid, jobs = set(), set(), set(), {}
        answered, self.waited = self.waited + self.answers(), []
        self.unheard.update((t.id, t) for t, _ in answered)
        for t, bad in answered:
            if t.kind == "load":
                recving.add(t.req)
                invalid.update(bad)
                if t.key is not None:  # 0.21+ offloading: a load job is also reported by id
                    jobs[t.key] = 1
            elif t.kind in ("send", "release"):
                sending.add(t.req)
            elif t.key is not None:
                jobs[t.key] = 1
        out = KVConnectorOutput(finished_sending=sending or None, finished_recving=recving or None)
        if invalid:
            out.invalid_block_ids = invalid
        if jobs:
            out.kv_connector_worker_meta = worker_meta(jobs)
        return out, [t.id for t, _ in answered]


W = Worker()


def faults_of(faults):
    W.plan = list(faults)


def worker_meta(jobs):
    raise AssertionError(f"job-keyed completions {jobs} for a connector without them")


def take(out):
    """The store and load jobs of a step's connector metadata (real connectors)."""


def on_preempt(rid):
    """What the worker does when a request is preempted."""


def evict_cpu():
    """Evict the CPU tier's idle blocks (the offloading connector's)."""
'''

MOONCAKE = '''

# --- MooncakeStoreConnector: kvoracle's store index answers its lookups --------------------
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import scheduler as _mooncake_scheduler
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store import data as _mooncake_data


class StoreIndex:
    """Stands in for the lookup client (a ZMQ client of the workers' key index): hits are
    the leading blocks completed store jobs stored, short of the prompt's last token."""

    def __init__(self, *args, **kwargs):
        pass

    def lookup(self, *args, **kwargs):
        tokens, hashes = (args[1], args[2]) if len(args) >= 3 else (args[0], args[1])
        hit = 0
        for h in hashes:
            if h not in W.stored:
                break
            hit += 1
        hit = min(hit * B, (tokens - 1) // B * B)
        result = getattr(_mooncake_data, "MooncakeLookupResult", None)
        return hit if result is None else result(hit)

    def discard(self, *args, **kwargs):
        pass

    def reset(self):
        return True

    def close(self):
        pass


_mooncake_scheduler.LookupKeyClient = StoreIndex
_saves = getattr(_mooncake_data, "MooncakeStoreWorkerMetadata", None)
W.keyed_by_request = _saves is None  # <= 0.27.1: a finished request's free waits for its jobs


def worker_meta(jobs):
    return _saves(completed_saves=dict(jobs))


def take(out):
    meta = out.kv_connector_metadata
    for rm in getattr(meta, "requests", ()):
        groups = rm.block_ids
        flat = [b for g in groups for b in g] if groups and isinstance(groups[0], (list, tuple)) else list(groups)
        spec = rm.load_spec
        if spec is not None and spec.can_load:
            W.start("load", rm.req_id, flat[spec.vllm_cached_tokens // B: spec.kvpool_cached_tokens // B])
        if rm.can_save and rm.token_len_chunk > 0:
            n = rm.token_len_chunk // B
            W.start("store", rm.req_id, flat[:n], key=getattr(rm, "store_job_id", None), hashes=rm.block_hashes[:n])
'''

OFFLOAD_PART = '''

# --- OffloadingConnector: kvoracle's worker runs its CPU<->GPU copies ----------------------


def _ids(spec):
    return [int(b) for b in spec.block_ids]


def cpu_manager():
    return sched.connector.connector_scheduler.manager


def chains():
    """Each block hash of every request seen, with the hash before it (None: first)."""
    parent = {}
    for req in REQS.values():
        before = None
        for h in req.block_hashes:
            parent.setdefault(h, before)
            before = h
    return parent
'''

OFFLOAD_BY_REQUEST = '''

# --- its 0.15 .. 0.20 layout: reqs_to_store / reqs_to_load, completions by request ----------
# (0.19 and 0.20 moved it into the offloading/ package and key the CPU tier by OffloadKey, a
# block hash with its KV cache group; the metadata, preemptions and completions are 0.18's)
W.keyed_by_request = True  # a finished request's free waits for its stores (finished_sending)


def on_preempt(rid):
    """A preempted request's stores end before the next forward: the worker waits for
    them (OffloadingConnectorWorker.handle_preemptions), whatever they answer."""
    for t in W.of(rid, "store"):
        W.end(t)


def take(out):
    meta = out.kv_connector_metadata
    for rid in out.preempted_req_ids or ():
        on_preempt(rid)
    for rid, (src, dst) in meta.reqs_to_store.items():
        W.start("store", rid, _ids(src))
    for rid, (src, dst) in meta.reqs_to_load.items():
        W.start("load", rid, _ids(dst))

'''

# --- the CPU tier up to 0.18: LRU/ARCOffloadingManager over a CPUBackend -----------------------
CPU_BACKEND = '''

def evict_cpu():  # every stored CPU block no load reads, leaves first (a chain's last block first)
    m = cpu_manager()
    parent = chains()
    while True:
        parents = {parent.get(h) for h in m.blocks}
        leaves = [h for h, b in m.blocks.items() if b.ref_cnt == 0 and h not in parents]
        if not leaves:
            return
        for h in leaves:
            m.backend.free(m.blocks.pop(h))
'''

OFFLOAD_BY_JOB = '''

# --- its 0.21+ layout (PR 39186): load and store jobs by id, completions in OffloadingWorkerMetadata ---
# The worker submits a step's store jobs at the next step's start and its loads at once;
# before the forward it waits for the jobs the step flushes (jobs_to_flush: a preempted
# request's stores, and stores still reading blocks handed out again); every job ends by
# its id in completed_jobs, a load also by its request's finished_recving.
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata


def worker_meta(jobs):
    return OffloadingWorkerMetadata(completed_jobs=dict(jobs))


def flush(ids):
    """Wait for the jobs in ids still running (OffloadingConnectorWorker.handle_preemptions)."""
    for t in [t for t in W.live.values() if t.key in ids]:
        W.wait(t)


def on_preempt(rid):
    """preempt() frees the request's blocks between steps; vLLM flushes its stores at the
    next schedule(), before anything is written to them: end them now."""
    flush({t.key for t in W.of(rid, "store")})


def specs(job):
    """A job's (source, destination): one transfer_spec pair up to 0.25, two fields from 0.26."""
    return job.transfer_spec if hasattr(job, "transfer_spec") else (job.src_spec, job.dst_spec)


def take(out):
    meta = out.kv_connector_metadata
    for jid, job in meta.store_jobs.items():
        W.start("store", job.req_id, _ids(specs(job)[0]), key=jid)
    flush(meta.jobs_to_flush or ())
    for jid, job in meta.load_jobs.items():
        assert not getattr(job, "sync", False), "sync loads (sync_load_budget_bytes) are not driven"
        W.start("load", job.req_id, _ids(specs(job)[1]), key=jid)
'''

# --- the CPU tier from 0.19 (PR 37874): CPUOffloadingManager, its CachePolicy holding the
# blocks ("chunks" from 0.3x) by OffloadKey, and a pool of its own (_free_list) ----------------
CPU_POLICY = '''
try:  # an offload key: a block hash and its KV cache group (one group here)
    from vllm.v1.kv_offload.base import get_offload_block_hash, make_offload_key
except ImportError:
    try:  # 0.20: in kv_offload/abstract.py
        from vllm.v1.kv_offload.abstract import get_offload_block_hash, make_offload_key
    except ImportError:  # 0.19: the tier is keyed by the block hash itself
        def make_offload_key(block_hash, group_idx):
            return block_hash

        def get_offload_block_hash(key):
            return key


def slot(obj, name):
    """The name of a CPU manager's field: "..chunk.." from 0.3x, "..block.." before."""
    return name if hasattr(obj, name) else name.replace("chunk", "block")


def cpu_chunks():
    """The CPU tier's chunks by offload key (LRU holds them in one dict, ARC in two)."""
    p = cpu_manager()._policy
    return {**p.t1, **p.t2} if hasattr(p, "t1") else dict(getattr(p, slot(p, "chunks")))


def evict_cpu():  # every idle chunk not before a busy one in its chain, as prepare_store evicts
    m = cpu_manager()
    parent = {make_offload_key(h, 0): p and make_offload_key(p, 0) for h, p in chains().items()}
    chunks = cpu_chunks()
    keep = set()
    for k, c in chunks.items():
        while c.ref_cnt != 0 and k is not None and k not in keep:
            keep.add(k)
            k = parent.get(k)
    evicted = m._policy.evict(len(chunks.keys() - keep), keep) or []
    count = slot(m, "_num_evictable_cache_chunks")
    if hasattr(m, count):  # the manager's count of idle chunks: not in 0.20.2, in 0.26.0
        setattr(m, count, getattr(m, count) - len(evicted))
    for _, c in evicted:
        getattr(m, slot(m, "_free_chunk"))(c)
'''

ENGINE = '''

# --- the engine: EngineCore's loop around vLLM's Scheduler --------------------------------
sched_class = Scheduler
if ASYNC:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler as sched_class
sched = sched_class(vllm_config, kv_cache_config, StructuredOutputManager(vllm_config), block_size=B)
mgr = sched.kv_cache_manager
pool = mgr.block_pool
REQS = {}  # every request submitted, by id (vLLM forgets a request once it is freed)
QUEUE = deque()  # steps in flight (async scheduling): (output, blocks written, requests sampling, worker's report)
DEPTH = 2 if ASYNC else 1
HELD = []  # requests preempted since the last schedule(): vLLM resumes none in the step that preempts it
OUT_OF_BAND = set()  # ... and, before vLLM reported such preemptions itself (0.27), their ids
if CONNECTOR != "kvoracle" and not hasattr(sched, "reset_preempted_req_ids"):
    _build_meta = sched.connector.build_connector_meta

    def _with_preempted(out):  # what 0.27+ does with reset_preempted_req_ids
        out.preempted_req_ids = set(out.preempted_req_ids or ()) | OUT_OF_BAND
        OUT_OF_BAND.clear()
        return _build_meta(out)

    sched.connector.build_connector_meta = _with_preempted
''' + REQUEST_ARGS + '''# 0.29+: schedule() preempts with drop_stale_output=requires_kv_delivery (a KV producer's in-flight
# output is dropped and the request resumes at once; otherwise it waits for that output)
_preempt_args = ({"drop_stale_output": sched.requires_kv_delivery}
                 if "drop_stale_output" in inspect.signature(sched._preempt_request).parameters else {})


def submit(rid, tokens):
    REQS[rid] = req = Request(request_id=rid, prompt_token_ids=list(tokens), pooling_params=None,
                              sampling_params=SamplingParams(max_tokens=MAX_TOKENS), block_hasher=hasher,
                              **_request_args)
    sched.add_request(req)


def _dispatch():
    out = sched.schedule()
    for req in HELD:
        sched.waiting.prepend_request(req)
    HELD.clear()
    take(out)
    tables = mgr.coordinator.single_type_managers[0].req_to_blocks
    writes, sampling = {}, set()
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        start = req.num_computed_tokens - n  # schedule() advanced it
        writes[rid] = [b.block_id for b in tables[rid][start // B:(start + n - 1) // B + 1]]
        if req.num_computed_tokens >= req.num_tokens:  # not a partial prefill: the step samples
            sampling.add(rid)
    # The worker runs the step now: its KVConnectorOutput (what ended by now, the jobs it
    # flushed included) travels with the step's model output, which the scheduler processes
    # when it pops the step (with async scheduling, after it has scheduled the next one).
    QUEUE.appendleft((out, writes, sampling, W.report()))
    return out


def _process():
    out, _, sampling, (report, reported) = QUEUE.pop()
    ids = list(out.num_scheduled_tokens)
    ran = runner_output(ids, [[1] if r in sampling else [] for r in ids])
    ran.kv_connector_output = report
    W.heard(reported)
    sched.update_from_output(out, ran)


def _step():
    W.now += 1
    if BUSY or sched.has_requests() or HELD:
        out = _dispatch()
        if len(QUEUE) < DEPTH and out.total_num_scheduled_tokens > 0:
            return  # async scheduling: the next step is scheduled before this one's output
    if QUEUE:
        _process()


def guarded(call, faults=()):
    """Run one engine call under faults; the exception it raised, if any, handed back
    once the worker's plan is cleared (the adapter's recorded statement raises it)."""
    faults_of(faults)
    try:
        call()
    except Exception as e:
        return e
    finally:
        W.plan = []
        W.note_delayed()
    return None


def step(faults=()):
    return guarded(_step, faults)


def tick(n):
    for _ in range(n):
        error = guarded(_step)
        if error is not None:
            return error
    return None


def _release_held(ids):  # a request preempted since the last schedule() is in the waiting queue
    for req in [r for r in HELD if r.request_id in ids]:
        HELD.remove(req)
        sched.waiting.prepend_request(req)


def finish(ids, faults=()):
    _release_held(ids)
    return guarded(lambda: sched.finish_requests(ids, RequestStatus.FINISHED_STOPPED), faults)


def abort(rid, faults=()):
    _release_held([rid])
    return guarded(lambda: sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED), faults)


def _preempt(rid):
    req = sched.requests[rid]
    sched.running.remove(req)
    sched._preempt_request(req, time.monotonic(), **_preempt_args)
    if ASYNC and QUEUE and hasattr(req, "async_tokens_to_discard"):  # as reset_prefix_cache does (0.23)
        req.async_tokens_to_discard = req.num_output_placeholders
        req.num_output_placeholders = 0
    elif ASYNC and QUEUE and hasattr(req, "discard_latest_async_tokens"):  # (<= 0.22)
        req.num_output_placeholders = 0
        req.discard_latest_async_tokens = True
    getattr(sched, "prev_step_scheduled_req_ids", set()).discard(rid)
    sched.waiting.remove_requests([req])
    HELD.append(req)
    OUT_OF_BAND.add(rid)
    on_preempt(rid)


def preempt(rid, faults=()):
    return guarded(lambda: _preempt(rid), faults)


def evict_all():
    cached = {b.block_id for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None}
    if cached:
        evict_cached(cached)
    evict_cpu()

'''

# Stable fault serialisation for the script: (kind, done, delay).
def _faults(faults: Sequence[Fault]) -> str:
    return repr([(f.kind.value, f.done, f.delay) for f in faults])


def _hash_name(h: Any) -> str:
    raw = bytes(h)
    return "block " + raw[:6].hex()


def _rooted(stored: Collection[Any], parent: Mapping[Any, Any]) -> set[Any]:
    """The stored hashes whose whole chain before them is stored too: the nodes of the
    tree a lookup walks (it stops at the first hash missing)."""
    nodes = set()
    for h in stored:
        p = parent.get(h)
        while p is not None and p in stored:
            p = parent.get(p)
        if h in parent and p is None:
            nodes.add(h)
    return nodes


def vllm_version() -> tuple[int, ...]:
    """The installed vLLM's version (0.15.1 -> (0, 15, 1)); () when absent."""
    try:
        text = version("vllm")
    except PackageNotFoundError:
        return ()
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


ALL_KINDS = frozenset({FaultKind.RAISE, FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.HANG, FaultKind.LATE,
                       FaultKind.TWICE})


class VllmConnector(Scripted):
    """vLLM's Scheduler (0.21.0 .. 0.34.0) with MooncakeStoreConnector: store jobs for every running
    request, loads of what the store holds, every fault kind."""

    name = "vllm-connector"
    block_size = 4
    gpu_blocks = 10  # vLLM's num_blocks: the null block and 9 usable
    reserve = 1  # the null block: never a request's
    cpu_blocks = 0
    timeout = 8  # ticks; longer than the longest LATE delay the machine draws (6)
    max_tokens = 12  # a request stops by length after this many output tokens
    max_seqs = 4
    batch_tokens = 64  # max_num_batched_tokens: prefills of several requests share it (chunked)
    fault_kinds: frozenset[FaultKind] = ALL_KINDS
    refusals: Mapping[BadInput, type[Exception]] = {}  # vLLM tolerates the scheduler-level bad calls
    # the row's options
    connector = "mooncake"  # "kvoracle", "mooncake" or "offload"
    role = "kv_both"
    loads = True  # kvoracle's connector: every new request's prompt is a remote prefill
    sends = True  # kvoracle's connector: every finished request's KV is sent before the free
    async_scheduling = False
    busy = False  # step even when Scheduler.has_requests() is False (other traffic)
    eviction_policy = "lru"  # the offloading connector's CPU tier ("lru" or "arc")
    versions: tuple[tuple[int, ...], tuple[int, ...]] = ((0, 21, 0), NEWEST)  # MooncakeStoreConnector's

    def __init__(self) -> None:
        self.vllm = vllm_version()
        require_release("vLLM", self.vllm, *self.versions, type(self).__name__, absent_ok=False)
        if self.busy and self.async_scheduling:  # an empty model step would stay queued, a transfer for ever
            raise RuntimeError(f"{type(self).__name__}: busy and async_scheduling together are not driven "
                               "(the adapter's queue keeps an empty step in flight: a false LIVE-DRAIN)")
        self.preamble = self.build_preamble()
        super().__init__()

    def build_preamble(self) -> str:
        options = (f"B, N, MAX_LEN, MAX_TOKENS, MAX_SEQS = {self.block_size}, {self.gpu_blocks}, 64, "
                   f"{self.max_tokens}, {self.max_seqs}\n"
                   f"CONNECTOR, ROLE, LOADS, SENDS = {self.connector!r}, {self.role!r}, {self.loads}, {self.sends}\n"
                   f"ASYNC, BUSY, BATCH = {self.async_scheduling}, {self.busy}, {self.batch_tokens}\n"
                   f"OFFLOAD = {self.cpu_blocks}, {self.eviction_policy!r}\n")
        part = {"kvoracle": "", "mooncake": MOONCAKE, "offload": OFFLOAD_PART + self.offload_layout()}[self.connector]
        return (HEAD + options + CONNECTOR_CLASS + cpu_engine(self.vllm) + CONFIG + WORKER + part + ENGINE
                + evict_cached(self.vllm))

    def offload_layout(self) -> str:
        """The offloading connector's layout in the installed release: completions by
        request up to 0.20, by job id from 0.21 (PR 39186); the CPU tier a manager over a
        CPUBackend up to 0.18, a CPUOffloadingManager with a CachePolicy from 0.19 (PR
        37874). Checked on 0.18.0, 0.20.2, 0.26.0, 0.29.0 (and the pinned releases)."""
        transfers = OFFLOAD_BY_JOB if self.vllm >= JOBS_FROM else OFFLOAD_BY_REQUEST
        return transfers + (CPU_POLICY if self.vllm >= POLICY_FROM else CPU_BACKEND)

    def bind(self) -> None:
        ns = self.namespace
        self.sched: Any = ns["sched"]
        self.mgr: Any = ns["mgr"]
        self.pool: Any = ns["pool"]
        self.worker: Any = ns["W"]
        self.reqs: dict[str, Any] = ns["REQS"]  # type: ignore[assignment]
        self.queue: Any = ns["QUEUE"]
        self.status: Any = ns["RequestStatus"]
        # FINISHED_ERROR (a request failed by the engine, e.g. a KV load under the "fail"
        # policy) came in 0.13.0
        status: Any = self.status
        self.aborted: set[Any] = {status.FINISHED_ABORTED} | (
            {status.FINISHED_ERROR} if vllm_version() >= FINISHED_ERROR_FROM else set())
        self.pin_steps = bool(ns["ASYNC"]) and ns["ROLE"] in ("kv_consumer", "kv_both")

    # --- operations ------------------------------------------------------------------------

    def _call(self, statement: str) -> None:
        """One engine call; what it raised (the preamble's `guarded` hands it back) is raised
        again by the recorded statement itself, so that a reproduction ends where the
        campaign's program did, with that exception (VALID-INPUT), and does not run on."""
        self.run(f"_ = {statement}\nif isinstance(_, BaseException):\n    raise _")

    def submit(self, r: RequestId, tokens: Sequence[int]) -> None:
        self.run(f"submit('r{r}', {list(tokens)})")

    def schedule(self, faults: Sequence[Fault]) -> None:
        self._call(f"step({_faults(faults)})")

    def finish(self, batch: Sequence[RequestId], faults: Sequence[Fault]) -> None:
        self._call(f"finish({[f'r{r}' for r in batch]}, {_faults(faults)})")

    def preempt(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._call(f"preempt('r{r}', {_faults(faults)})")

    def abort(self, r: RequestId, faults: Sequence[Fault]) -> None:
        self._call(f"abort('r{r}', {_faults(faults)})")

    def tick(self, n: int) -> None:
        self._call(f"tick({n})")

    def evict_all(self) -> None:
        self.run("evict_all()")

    def bad_call(self, kind: BadInput) -> bool:
        return False

    # --- what the machine asks -------------------------------------------------------------

    def _tables(self) -> Any:
        return self.mgr.coordinator.single_type_managers[0].req_to_blocks

    def _holds(self, rid: str) -> bool:
        return any(b.block_id and not b.is_null for b in self._tables().get(rid, ()))

    def _status(self, rid: str, req: Any) -> Status:
        s = req.status
        if self.status.is_finished(s):
            if rid in self.worker.cut_short:  # its exit raised before the free: not exited
                return Status.RUNNING if self._holds(rid) else Status.WAITING
            return Status.ABORTED if s in self.aborted \
                else Status.FINISHED
        if s == self.status.RUNNING or self._holds(rid):  # holding blocks (an async load): admitted
            return Status.RUNNING
        return Status.PREEMPTED if s == self.status.PREEMPTED else Status.WAITING

    def statuses(self) -> dict[RequestId, Status]:
        return {RequestId(int(rid[1:])): self._status(rid, req) for rid, req in self.reqs.items()}

    def running(self) -> list[RequestId]:
        return [RequestId(int(r.request_id[1:])) for r in self.sched.running
                if r.status == self.status.RUNNING and r.request_id not in self.worker.cut_short]

    def waiting(self) -> list[RequestId]:
        return [r for r, s in self.statuses().items() if s in (Status.WAITING, Status.PREEMPTED)]

    def _steps_in_flight(self) -> list[tuple[str, dict[str, list[int]]]]:
        """(name, blocks each request's KV is written to) of each model step in flight,
        where that counts as a transfer: async scheduling with a KV consumer, whose loads
        are not ordered with the step's writes."""
        if not self.pin_steps:
            return []
        return [(f"step {out.total_num_scheduled_tokens}@{id(out):x}", writes) for out, writes, *_ in self.queue]

    def transfers(self) -> list[object]:
        live: list[object] = [repr(t) for t in self.worker.pending()]
        return live + [name for name, _ in self._steps_in_flight()]

    def faults_injected(self) -> int:
        return int(self.worker.injected)

    def outcomes(self) -> dict[str, int]:
        return dict(self.worker.ended)

    def state(self) -> System | None:
        return None

    def events(self) -> list[Event] | None:
        return None

    def invariants(self) -> list[Violation]:
        return []  # the machine evaluates spec's predicates on the observations

    def content(self) -> list[Violation]:
        return []

    def snapshot(self) -> object:
        o = self.observe()
        return o.free, o.tables, o.cached, o.refcounts, self.statuses()

    # --- observations ----------------------------------------------------------------------

    def _transfer_held(self) -> Counter[int]:
        """References vLLM holds on blocks on behalf of transfers: an exited request's
        table kept until its transfer reports, a store job's references (0.28+), the
        deferred frees of steps in flight (0.24+)."""
        held: Counter[int] = Counter()
        busy = {t.req for t in self.worker.pending()}
        if self.pin_steps:
            busy |= {r for _, writes in self._steps_in_flight() for r in writes}
        for rid, blocks in self._tables().items():
            req = self.reqs.get(rid)
            if req is not None and self._status(rid, req) in EXITED and rid in busy:
                held.update(b.block_id for b in blocks if not b.is_null)
        side = getattr(getattr(self.sched, "connector", None), "connector_scheduler", None)
        for ids, _ in getattr(side, "_pinned_saves", {}).values():
            held.update(ids)
        for _, blocks in getattr(self.sched, "deferred_frees", ()):
            held.update(b.block_id for b in blocks if not b.is_null)
        return held

    def _fenced(self) -> set[int]:
        """Blocks on the free queue that an in-flight store job still reads, fenced by the
        offloading connector (0.21+, PR 39186: _block_id_to_pending_jobs): handing one out
        again flushes the job first (jobs_to_flush), so the job owns the block until it ends."""
        side = getattr(getattr(self.sched, "connector", None), "connector_scheduler", None)
        fences: Mapping[int, set[int]] = getattr(side, "_block_id_to_pending_jobs", {})
        running = {t.key for t in self.worker.pending() if t.kind == "store"}
        return {b for b, jobs in fences.items() if not running.isdisjoint(jobs)}

    def observe(self) -> Observation:
        pool = self.pool
        whole = pool.free_block_queue.get_all_free_blocks()
        fenced = self._fenced() & {b.block_id for b in whole}
        queue = [b for b in whole if b.block_id not in fenced]
        on_queue = {b.block_id for b in queue}
        statuses = {rid: self._status(rid, req) for rid, req in self.reqs.items()}
        live = {rid for rid, s in statuses.items() if s not in EXITED}
        tables = {rid: tuple(b.block_id for b in blocks if not b.is_null)
                  for rid, blocks in self._tables().items() if rid in live}
        tables = {rid: t for rid, t in tables.items() if t}
        listed = {b for t in tables.values() for b in t}
        held = self._transfer_held()
        pinned: set[int] = set()
        work = [(t.req, t.blocks) for t in self.worker.live.values()]
        work += [(rid, blocks) for _, writes in self._steps_in_flight() for rid, blocks in writes.items()]
        for rid, blocks in work:
            own = set(tables.get(rid, ()))
            pinned.update(b for b in blocks if b not in own and 0 < b < len(pool.blocks))
        blocks = pool.blocks[1:]
        return Observation(
            ids=range(1, len(pool.blocks)),
            free=tuple(b.block_id for b in queue if b.block_hash is None),
            evictable=tuple(b.block_id for b in queue if b.block_hash is not None),
            tables=tables,
            cached=frozenset(b.block_id for b in blocks if b.block_hash is not None),
            refcounts={b.block_id: b.ref_cnt - held[b.block_id] for b in blocks},
            counters={"get_num_free_blocks": (pool.get_num_free_blocks(), len(whole))},
            waiting=frozenset(rid for rid, s in statuses.items() if s in (Status.WAITING, Status.PREEMPTED)),
            tokens={rid: int(self.reqs[rid].num_computed_tokens) for rid in tables},
            pinned=frozenset(pinned),
            in_flight=tuple(sorted(b for b in held.keys() | fenced if b not in listed and b not in on_queue
                                   and pool.blocks[b].block_hash is None)),
        )

    def observe_cpu(self) -> Observation:
        """The offloading connector's CPU tier: its blocks, free or holding a block hash
        (stored: cached; being stored: owned by the store; read by an in-flight load:
        pinned). The tree is the hash chains of the requests' blocks: a stored block is a
        node of it when every block before it in its chain is stored too (lookups walk a
        chain from its first block and stop at the first miss); eviction can find every
        stored block (the manager's LRU/ARC order holds them all)."""
        if self.connector != "offload":
            return Observation(ids=range(0), free=(), cached=frozenset(), in_flight=(), pinned=frozenset())
        m = self.namespace["cpu_manager"]()  # type: ignore[operator]
        if hasattr(m, "_policy"):
            return self._observe_chunks(m)
        backend = m.backend
        entries = dict(m.blocks)
        ready = {h: b for h, b in entries.items() if b.ref_cnt >= 0}
        nodes = _rooted(entries, self._parents())
        return Observation(
            ids=range(int(backend.num_blocks)),
            free=tuple(backend.allocated_blocks_free_list) + tuple(
                range(backend.num_allocated_blocks, backend.num_blocks)),
            cached=frozenset(int(b.block_id) for b in ready.values()),
            in_flight=tuple(sorted(int(b.block_id) for h, b in entries.items() if h not in ready)),
            pinned=frozenset(int(b.block_id) for b in ready.values() if b.ref_cnt > 0),
            nodes=frozenset(_hash_name(h) for h in nodes),
            findable=frozenset(_hash_name(h) for h in entries),
        )

    def _observe_chunks(self, m: Any) -> Observation:
        """observe_cpu from 0.19 (PR 37874's CPUOffloadingManager): the manager's chunk pool
        (its free list and the ids never handed out) and its policy's chunks by offload key
        (a block hash and its KV cache group, one group here; the hash alone in 0.19). A
        chunk being written (ref_cnt -1) is owned by its store; one a load reads (ref_cnt >
        0) is pinned. Its counters, where it keeps them, are recounted."""
        chunks: dict[Any, Any] = self.namespace["cpu_chunks"]()  # type: ignore[operator]
        slot: Any = self.namespace["slot"]

        def field(name: str) -> Any:
            return getattr(m, slot(m, name))

        ids = {k: int(getattr(c, "chunk_id", getattr(c, "block_id", -1))) for k, c in chunks.items()}
        block_hash: Any = self.namespace["get_offload_block_hash"]
        by_hash = {bytes(block_hash(k)): c for k, c in chunks.items()}
        nodes = _rooted(by_hash, self._parents())
        recount = {"_num_evictable_cache_chunks": lambda c: c.ref_cnt == 0,  # from 0.24 (none in 0.19 .. 0.23)
                   "_num_write_pending_chunks": lambda c: c.ref_cnt < 0}  # from 0.26
        counters = {name: (field(name), sum(map(idle, chunks.values())))
                    for name, idle in recount.items() if hasattr(m, slot(m, name))}
        evictable = getattr(m._policy, "_evictable", None)  # LRU's set of idle chunks
        if evictable is not None:
            counters["LRUCachePolicy._evictable"] = (
                len(evictable), sum(c.ref_cnt == 0 for c in chunks.values()))
        return Observation(
            ids=range(int(field("_num_chunks"))),
            free=tuple(m._free_list) + tuple(range(field("_num_allocated_chunks"), field("_num_chunks"))),
            cached=frozenset(ids[k] for k, c in chunks.items() if c.ref_cnt >= 0),
            in_flight=tuple(sorted(ids[k] for k, c in chunks.items() if c.ref_cnt < 0)),
            pinned=frozenset(ids[k] for k, c in chunks.items() if c.ref_cnt > 0),
            counters=counters,
            nodes=frozenset(_hash_name(h) for h in nodes),
            findable=frozenset(_hash_name(h) for h in by_hash),
        )

    def _parents(self) -> dict[Any, Any]:
        """Each block hash of every request seen, with the hash before it (None: first)."""
        out: dict[Any, Any] = {}
        for req in self.reqs.values():
            before = None
            for h in req.block_hashes:
                out.setdefault(h, before)
                before = h
        return out


# --- the hunt's rows: each steers the campaign to one real bug's path ------------------------


class MooncakePreemptStore(VllmConnector):
    """vLLM issue 52360 (51637), PR 52372: MooncakeStoreConnector; preemption returns a
    request's blocks to the pool while its queued store jobs still read them (INV-PIN).
    Buggy 0.21.0 .. 0.27.1, fixed in 0.28.0. Store jobs end late, fail or half succeed,
    never hang (a hung job's reference is kept for good from 0.28.0 on: LIVE-TRANSFER)."""

    name = "vllm-mooncake-preempt-store"
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})


class MooncakeAbortUntracked(VllmConnector):
    """vLLM PR 43281: MooncakeStoreConnector's request_finished asserts that the request
    has a tracker; a request aborted before its first schedule() has none, and the
    AssertionError escapes finish_requests (VALID-INPUT), which kills EngineCore. Buggy
    0.21.0 (the connector's first release), fixed in 0.22.0. Both releases also have
    MooncakePreemptStore's bug (INV-PIN): the hunt row lists it as known. Its options."""

    name = "vllm-mooncake-abort-untracked"
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})


class AbortDuringLoad(VllmConnector):
    """vLLM PR 32255: aborting a request while its asynchronous load is in flight
    (WAITING_FOR_REMOTE_KVS) frees the load's destination blocks at once (INV-PIN).
    Buggy 0.15.1 (0.12.0 .. 0.14.1 too: the same 2-step program), fixed in 0.16.0. No
    sends and no hung loads (0.16.0 waits for the load of an aborted request: issue
    46283); a busy engine (0.16.0 idles while an aborted
    request's load is pending: PR 43433). Both releases also stand still when a preempted
    request heads the queue (RemoteKvHeadOfLine): the hunt row lists LIVE-PROGRESS as known."""

    name = "vllm-abort-during-load"
    connector = "kvoracle"
    versions = (OWN_CONNECTOR_OLDEST, NEWEST)
    sends = False
    busy = True
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})


class RemoteKvHeadOfLine(AbortDuringLoad):
    """vLLM issue 30659: requests whose asynchronous loads have ended wait behind the head
    of the waiting queue to be promoted, holding the blocks their loads filled; a request
    that cannot be given its blocks heads that queue, and its failed allocation ends the
    pass before they are reached: nothing runs again (LIVE-PROGRESS). Up to 0.17.1 the
    head is a request the scheduler preempted; 0.18.0 serves loading requests first (PR
    35781), and the head is then a promoted load that needs one block more (the shape of
    issue 45388 and PR 57104); 0.19.0 starts a load only when the whole prompt fits (PR
    37307). AbortDuringLoad's options: no sends, no hung loads, a busy engine."""

    name = "vllm-remote-kv-head-of-line"


class AsyncConsumerFree(VllmConnector):
    """vLLM PR 45357: async scheduling with a KV consumer; a request that finishes or is
    preempted while the next step (already dispatched) writes its KV has its blocks
    freed at once, and another request's load may land in them (INV-PIN). Buggy
    0.15.1 .. 0.23.0, fixed in 0.24.0. Every new request loads its prompt; no sends."""

    name = "vllm-async-consumer-free"
    connector = "kvoracle"
    role = "kv_consumer"
    sends = False
    async_scheduling = True
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})
    versions = (OWN_CONNECTOR_OLDEST, NEWEST)


class IdleDelayedFree(VllmConnector):
    """vLLM PR 43433: once a finished request whose free its connector delays (a send)
    has been reported, Scheduler.has_requests() is False and EngineCore stops stepping:
    the send's completion is never collected and the blocks stay held (LIVE-TRANSFER,
    LIVE-DRAIN). Buggy 0.15.1 .. 0.21.0, fixed in 0.22.0. Sends that answer late; no loads."""

    name = "vllm-idle-delayed-free"
    connector = "kvoracle"
    versions = (OWN_CONNECTOR_OLDEST, NEWEST)
    loads = False
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})


class AbortLoadNeverAnswers(VllmConnector):
    """vLLM issue 46283 (PR 46289, open): an abort in WAITING_FOR_REMOTE_KVS waits for the
    load's finished_recving; a load that never answers keeps the blocks for good
    (LIVE-TRANSFER, LIVE-DRAIN). 0.16.0 .. 0.34.0; no release fixes it."""

    name = "vllm-abort-load-never-answers"
    connector = "kvoracle"
    versions = (OWN_CONNECTOR_OLDEST, NEWEST)
    sends = False
    fault_kinds = frozenset({FaultKind.HANG})


class FinishedRaises(VllmConnector):
    """A connector's request_finished that raises (a storage write failing at exit):
    Scheduler._free_request calls it before _free_blocks with nothing to catch it, so the
    request stays FINISHED_* in the scheduler, holding its blocks (LIVE-EXIT). Every
    release 0.12.0 .. 0.34.0; the shape of FastDeploy PR 7807."""

    name = "vllm-finished-raises"
    connector = "kvoracle"
    versions = (OWN_CONNECTOR_OLDEST, NEWEST)
    loads = False
    fault_kinds = frozenset({FaultKind.RAISE})


class OffloadPrepareStoreEvicts(VllmConnector):
    """vLLM PR 35846: OffloadingConnector's CPU tier (LRU) makes room for a store by
    evicting the store's own inputs that are already on CPU, so the CPU tier keeps the
    new blocks without their prefix, unreachable by lookups (INV-TREE on the CPU tier;
    the observation shows it as INV-HEAP-SOUND: the LRU holds blocks that are not nodes of
    the tree lookups walk). Buggy 0.15.1 .. 0.17.1, fixed in 0.18.0; 0.18.0 still fails
    this campaign through the other path (another request's store evicts the parent of a
    chunk in flight: OffloadEvictsParentOfStore's bug). A busy engine (these releases idle
    with a delayed free pending: PR 43433); no hung transfers."""


    name = "vllm-offload-prepare-store-evicts"
    connector = "offload"
    cpu_blocks = 4
    busy = True
    # One store per step, of a whole prompt: one request at a time, one output token, no
    # chunked prefill. PR 35846 protects the blocks of the store being prepared; a store of
    # only the blocks a decode or a later chunk fills, or another request's store in the
    # same step, can still make room by evicting the parent of a block being stored in
    # 0.18 (another way to leave a block without its prefix, which the row steers away from).
    max_tokens = 1
    max_seqs = 1
    batch_tokens = 256
    fault_kinds = frozenset({FaultKind.ERROR, FaultKind.PARTIAL, FaultKind.LATE})
    versions = (OLDEST, (0, 18, 99))


class VllmOffload(VllmConnector):
    """vLLM's current CPU offloading tier: OffloadingConnector with CPUOffloadingSpec (LRU),
    its 0.21+ layout (load and store jobs by id, completions in OffloadingWorkerMetadata,
    a finished request's blocks freed at once and fenced while its stores read them), and
    on 0.19 .. 0.20 the by-request layout over the same CachePolicy tier (a busy engine
    below 0.22: see __init__). Every fault kind; the CPU tier has 4 blocks, so stores evict
    and fail to find room.

    Two findings, in 0.29.0 .. 0.34.0: a store job that never answers is waited for forever
    (LIVE-TRANSFER: no timeout, as everywhere in vLLM's connectors); and
    CPUOffloadingManager.prepare_store makes room by evicting any idle chunk but the
    store's own keys (LRUCachePolicy.evict with protected = those keys), so it evicts the
    parent of a chunk another job is still writing or a load reads: that chunk stays on the
    CPU tier without its prefix, where no lookup reaches it (INV-HEAP-SOUND on the CPU
    tier, spec's INV-TREE; the shape of PR 35846 across requests). The second is in 0.20.2
    and 0.26.0 too (the same prepare_store). 0.26.0 first fails VALID-INPUT: aborting a
    request never scheduled makes the next schedule() raise AssertionError in
    _build_store_jobs (vLLM issue 49118); 0.20.2 also stores a resumed request's later
    chunk after its earlier ones were evicted, without its prefix (the store cursor is not
    rewound on preemption), and 0.21 .. 0.22 a running request's decoded chunk after its
    prompt's chunks were evicted (they store decoded tokens; from 0.23 only the prompt, by default)."""

    name = "vllm-offload"
    connector = "offload"
    cpu_blocks = 4
    versions = (POLICY_FROM, NEWEST)

    def __init__(self) -> None:
        # Before 0.22 (vLLM PR 43433, IdleDelayedFree's bug) the engine stops stepping once the
        # last finished request whose free waits for its stores has been reported: every
        # program that finishes a stored request ends in LIVE-TRANSFER. On 0.19 .. 0.21 the row
        # runs a busy engine, as OffloadPrepareStoreEvicts does, so it reaches the CPU tier.
        if vllm_version() < IDLE_STEPS_FROM:
            self.busy = True
        super().__init__()


class OffloadAbortQueued(VllmOffload):
    """VllmOffload steered to vLLM issue 49118 alone: a CPU tier no store has to make room
    in (so not OffloadEvictsParentOfStore's finding) and no store that never answers. What
    is left: aborting a request that was never scheduled, after which the next schedule()
    raises AssertionError in _build_store_jobs (0.26.0; 0.27.0 has PR 49146's fix; 0.23.0
    .. 0.25.1 pass; 0.21 and 0.22 first store an orphan decoded chunk, INV-HEAP-SOUND)."""

    name = "vllm-offload-abort-queued"
    fault_kinds = frozenset(ALL_KINDS - {FaultKind.HANG})
    cpu_blocks = 64


class OffloadEvictsParentOfStore(VllmOffload):
    """VllmOffload steered to its second finding alone: no store that never answers (the
    first), so a CPU chunk left without its prefix is what a campaign finds."""

    name = "vllm-offload-evicts-parent-of-store"
    fault_kinds = frozenset(ALL_KINDS - {FaultKind.HANG})
