"""FastDeploy's PrefixCacheManager with chunked prefill, driven as ResourceManagerV1
(fastdeploy/engine/sched/resource_manager_v1.py) schedules a prompt that does not fit
one step's token budget: the machine chooses the chunks and how the chunks of different
requests interleave.

admit   = the WAITING path of ResourceManagerV1.schedule for the prompt's first chunk:
          request_match_blocks, blocks for the chunk (can_allocate_gpu_blocks, which may
          evict, then allocate_gpu_blocks), then update_cache_blocks with the tokens
          computed so far (oracle.engines.fastdeploy's `admit`, unchanged)
prefill = the RUNNING path for a request still in prefill: blocks for the next chunk
          (get_new_block_nums), then update_cache_blocks with the tokens computed so far,
          which inserts the full blocks the chunk completed into the radix tree
grow, finish, evict, bad inputs and observations: as oracle.engines.fastdeploy

The machine reveals a prompt chunk by chunk, so the request's prompt_token_ids grow with
each chunk and the match at admit covers the first chunk only, where FastDeploy, which
knows the whole prompt at admission, matches all of it. So that every program is one
FastDeploy can run, a chunk that starts with a block the tree held when the request was
admitted (FastDeploy would have matched it then) is refused with NoRoom, and nothing is
called. Importing this module does not import FastDeploy.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from kvoracle.oracle.engine import NoRoom, Op, descendants
from kvoracle.oracle.engines.fastdeploy import BLOCK, PREAMBLE, FastDeployAdapter

PREFILL = '''

def prefill(req, tokens):  # the next chunk of a RUNNING request; None: no room (it would preempt)
    req.prompt_token_ids.extend(tokens)  # the machine reveals the prompt chunk by chunk
    req.need_prefill_tokens += len(tokens)
    new_tokens = req.need_prefill_tokens - req.num_computed_tokens
    new_blocks = (req.num_computed_tokens + new_tokens + BLOCK - 1) // BLOCK - len(req.block_tables)
    if not pcm.can_allocate_gpu_blocks(new_blocks):  # may evict
        del req.prompt_token_ids[-len(tokens):]
        req.need_prefill_tokens -= len(tokens)
        return None
    req.block_tables.extend(pcm.allocate_gpu_blocks(new_blocks, req.request_id))
    req.num_computed_tokens += new_tokens
    pcm.update_cache_blocks(req, BLOCK, req.num_computed_tokens)
    return req.block_tables
'''


class FastDeployChunked(FastDeployAdapter):
    name = "fastdeploy-chunked"
    operations = frozenset({Op.ADMIT, Op.PREFILL, Op.GROW, Op.FINISH, Op.EVICT})
    preamble = PREAMBLE + PREFILL

    def bind(self) -> None:
        super().bind()
        self.hash_block = importlib.import_module("fastdeploy.utils").get_hash_str
        self.cached_at_admit: dict[str, set[str]] = {}  # request -> block hashes the tree held

    def admit(self, rid: str, tokens: Sequence[int]) -> int:
        self.cached_at_admit[rid] = {n.hash_value for n in descendants(self.pcm.radix_tree_root)}
        return super().admit(rid, tokens)

    def prefill(self, rid: str, tokens: Sequence[int]) -> None:
        if self._matched_at_admit(rid, tokens):
            raise NoRoom(f"FastDeploy matches the next chunk of {rid} at admission: no program of its")
        if self.run(f"_ = prefill({rid}, {list(tokens)})") is None:
            raise NoRoom(f"can_allocate_gpu_blocks refused the next chunk of {rid}")

    def _matched_at_admit(self, rid: str, tokens: Sequence[int]) -> bool:
        """The chunk's first block (after the blocks the request has in the tree) was in the
        tree when the request was admitted: FastDeploy's match would have taken it."""
        node, cached = self.pcm.req_to_radix_tree_info[rid]
        block = [*self.running[rid].prompt_token_ids, *tokens][cached: cached + BLOCK]
        if len(block) < BLOCK:
            return False
        key = [] if node.hash_value is None else [node.hash_value]
        return self.hash_block(block, key) in self.cached_at_admit[rid]
