"""Requests and their lifecycle states."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvoracle.spec.types import BlockHash, RequestId
from kvoracle.spec.state import Status


class WritePolicy(Enum):
    """When a request's blocks are written to the storage tier before release."""

    NONE = "none"
    ON_FINISH = "finish"
    ON_FINISH_AND_PREEMPT = "finish+preempt"

    def writes_on(self, status: Status) -> bool:
        if status is Status.FINISHED:
            return self is not WritePolicy.NONE
        if status is Status.PREEMPTED:
            return self is WritePolicy.ON_FINISH_AND_PREEMPT
        return False


@dataclass
class Request:
    id: RequestId
    tokens: list[int]  # prompt, then generated tokens
    status: Status = Status.WAITING
    admitted_at: int = -1  # admission order, for preemption (last admitted goes first)
    admissions: int = 0  # times admitted (re-admission follows a preemption)
    blocks: int = 0  # length of its block table while running
    preemptions: int = 0
    hashes: list[BlockHash] = field(default_factory=list)  # of its full blocks, kept as they fill
