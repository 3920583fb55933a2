"""Replay a Mooncake-format trace against one bounded block cache and count prefix hits.

Every request looks up its `hash_ids` (chained 512-token block ids) in order; its hits are the leading
blocks found cached, up to its first miss, as a prefix cache serves them. Then the request's blocks are
accessed (the policy scores them) and its missing blocks inserted, evicting the policy's victims; the
request's own blocks are held while it inserts, so it never evicts itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.kv_cache.policy import EvictionPolicy
from predictor.traces import TraceRequest


@dataclass
class HitCount:
    queries: int = 0  # blocks looked up
    hits: int = 0  # of those, found cached (leading blocks up to the first miss)

    @property
    def ratio(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def replay(requests: Sequence[TraceRequest], policy: EvictionPolicy, cache_blocks: int) -> HitCount:
    cached: set[int] = set()
    count = HitCount()
    for request in requests:
        keys = request.hash_ids
        count.queries += len(keys)
        count.hits += _leading_hits(keys, cached.__contains__)
        policy.access_chain(keys, request.timestamp_ms / 1000)
        _insert(keys, cached, policy, cache_blocks)
    return count


def unbounded(requests: Sequence[TraceRequest]) -> HitCount:
    """The bound: a cache that never evicts."""
    seen: set[int] = set()
    count = HitCount()
    for request in requests:
        count.queries += len(request.hash_ids)
        count.hits += _leading_hits(request.hash_ids, seen.__contains__)
        seen.update(request.hash_ids)
    return count


def _leading_hits(keys: Sequence[int], is_cached: Callable[[int], bool]) -> int:
    for index, key in enumerate(keys):
        if not is_cached(key):
            return index
    return len(keys)


def _insert(keys: Sequence[int], cached: set[int], policy: EvictionPolicy, cache_blocks: int) -> None:
    for key in keys:
        policy.candidate(key, False)
    for key in keys:
        if key in cached:
            continue
        if len(cached) >= cache_blocks:
            victim = policy.victim()
            if victim is None:  # the request alone fills the cache: its tail stays uncached
                policy.remove(key)
                continue
            cached.discard(victim)
            policy.remove(victim)
        cached.add(key)
    for key in keys:
        if key in cached:
            policy.candidate(key, True)
