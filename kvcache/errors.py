"""Bad input gets one of these, named after what was wrong; the state is left as it was."""

from __future__ import annotations


class KVCacheError(Exception):
    """Base class of every bad-input error raised by kvcache and scheduler."""


class BlockOutOfRange(KVCacheError):
    def __init__(self, tier: str, block: int, size: int) -> None:
        super().__init__(f"{tier} block {block} is out of range 0..{size - 1}")
        self.block = block


class DoubleFree(KVCacheError):
    def __init__(self, tier: str, block: int) -> None:
        super().__init__(f"{tier} block {block} is already free")
        self.block = block


class OutOfBlocks(KVCacheError):
    def __init__(self, tier: str, wanted: int, free: int) -> None:
        super().__init__(f"{tier}: {wanted} blocks wanted, {free} free")
        self.wanted = wanted
        self.free = free


class InvalidLimit(KVCacheError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"match limit must be >= 0, got {limit}")
        self.limit = limit


class UnknownRequest(KVCacheError):
    def __init__(self, request: int, why: str = "holds no blocks") -> None:
        super().__init__(f"request {request} {why}")
        self.request = request


class DuplicateRequest(KVCacheError):
    def __init__(self, request: int) -> None:
        super().__init__(f"request {request} already holds blocks")
        self.request = request


class UnknownTransfer(KVCacheError):
    def __init__(self, transfer: int) -> None:
        super().__init__(f"transfer {transfer} is not in flight")
        self.transfer = transfer


class InvalidOutcome(KVCacheError):
    def __init__(self, transfer: int, why: str) -> None:
        super().__init__(f"transfer {transfer}: {why}")
        self.transfer = transfer


class NotReady(KVCacheError):
    def __init__(self, request: int) -> None:
        super().__init__(f"request {request} still has blocks in flight")
        self.request = request


class HashMismatch(KVCacheError):
    def __init__(self, request: int, why: str) -> None:
        super().__init__(f"request {request}: {why}")
        self.request = request


class NotQuiescent(KVCacheError):
    def __init__(self, requests: list[int]) -> None:
        super().__init__(f"reset with live requests {requests}")
        self.requests = requests


class RequestTooLarge(KVCacheError):
    def __init__(self, request: int, blocks: int, pool: int) -> None:
        super().__init__(f"request {request} needs {blocks} blocks, the whole GPU pool has {pool}")
        self.request = request


class RequestGone(KVCacheError):
    def __init__(self, request: int, status: str) -> None:
        super().__init__(f"request {request} is already {status}")
        self.request = request


class NotRunning(KVCacheError):
    def __init__(self, request: int, status: str) -> None:
        super().__init__(f"request {request} is {status}, not running")
        self.request = request


class EmptyRequest(KVCacheError):
    def __init__(self, request: int) -> None:
        super().__init__(f"request {request} has no tokens")
        self.request = request
