"""An eviction policy that adapts to the trace it serves. Pure policy, no torch.

A fixed LFU decay suits one trace and loses on another: a short decay is recency (LRU), a long one is
frequency. So the cache runs several candidate policies side by side, LRU and LFU at decays from a minute
to hours, and evicts by whichever would have hit most on the recent stream of lookups. Each candidate has a
shadow cache of the real capacity (keys only) that replays the same lookups with that candidate's own
evictions, and counts its prefix hits; the counts decay over `horizon` cache-capacities of lookups, so the
choice follows the trace as its shape changes. It is ARC's idea (learn the balance of recency and
frequency from what misses would have hit) with whole shadow caches instead of ghost lists, so a
candidate is judged on exactly the hits it would have had. The leader, LRU at first, changes only when
another candidate's count passes its own by `margin` (5%), so near-ties do not make the cache thrash
between two orders, and before any candidate has proven better the cache is LRU.

Every candidate also tracks the real cache's blocks, so the leader can name a victim among them at once.
Costs: each lookup is replayed once per candidate (here 2 x 4 policies' work instead of 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from itertools import pairwise

from engine.kv_cache.policy import EvictionPolicy, LfuPolicy, LfuWeights, LruPolicy

CANDIDATE_DECAYS_S = (60.0, 600.0, 6000.0)  # LFU decays tried beside LRU
HORIZON_CAPACITIES = 4.0  # hit counts decay by e over this many cache-capacities of looked-up blocks
SWITCH_MARGIN = 0.05  # another candidate leads once its hit count passes the leader's by this share


class ChainLruPolicy(LruPolicy):
    """LRU that, like the LFU, evicts only leaves: a block whose chain children are tracked stays, since a
    child without its parent is useless to a prefix lookup (plain LRU would evict a session's head first
    when its blocks were cached head first, and strand the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[Hashable, Hashable] = {}
        self.children: dict[Hashable, set[Hashable]] = {}

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None:
        super().access(key, parent, now, vip)
        self._link(key, parent)

    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None:
        super().access_chain(keys, now, vip)
        for parent, key in pairwise(keys):
            self._link(key, parent)

    def _link(self, key: Hashable, parent: Hashable | None) -> None:
        if parent is not None and parent in self.order and key not in self.parents:
            self.parents[key] = parent
            self.children.setdefault(parent, set()).add(key)

    def victim(self) -> Hashable | None:
        return next((k for k, ok in self.order.items() if ok and k not in self.vip and not self.children.get(k)),
                    None)

    def remove(self, key: Hashable) -> None:
        super().remove(key)
        self.children.pop(key, None)
        parent = self.parents.pop(key, None)
        if parent is not None and parent in self.children:
            self.children[parent].discard(key)


def candidate_factories(weights: LfuWeights | None = None,
                        decays_s: Sequence[float] = CANDIDATE_DECAYS_S) -> list[Callable[[], EvictionPolicy]]:
    """LRU (leaves only) first, the tie-breaker, then LFU with the given shares at each decay."""
    base = weights or LfuWeights()
    lfus = [LfuWeights(decay, base.neighbour_share, base.prefix_share) for decay in decays_s]
    return [ChainLruPolicy, *[(lambda w=w: LfuPolicy(w)) for w in lfus]]


class ShadowCache:
    """Keys only: what a cache of `capacity` blocks under `policy` would hold, and the hits it would have."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.cached: set[Hashable] = set()

    def lookup(self, keys: Sequence[Hashable], now: float) -> int:
        """The leading keys found cached (a prefix lookup), then all of them inserted, most useful kept."""
        hits = next((index for index, key in enumerate(keys) if key not in self.cached), len(keys))
        self.policy.access_chain(keys, now)
        self._insert(keys)
        return hits

    def _insert(self, keys: Sequence[Hashable]) -> None:
        for key in keys:
            self.policy.candidate(key, False)
        for key in keys:
            if key not in self.cached and not self._make_room():
                self.policy.remove(key)  # the lookup alone fills the cache: its tail stays out
                continue
            self.cached.add(key)
        for key in keys:
            if key in self.cached:
                self.policy.candidate(key, True)

    def _make_room(self) -> bool:
        if len(self.cached) < self.capacity:
            return True
        victim = self.policy.victim()
        if victim is None:
            return False
        self.cached.discard(victim)
        self.policy.remove(victim)
        return True


class AdaptivePolicy:
    """Evicts as the candidate with the most (decayed) shadow hits would; see the module docstring."""

    def __init__(self, capacity: int, factories: Sequence[Callable[[], EvictionPolicy]] | None = None,
                 horizon: float = HORIZON_CAPACITIES, margin: float = SWITCH_MARGIN) -> None:
        makers = list(factories or candidate_factories())
        self.live = [make() for make in makers]
        self.shadows = [ShadowCache(make(), capacity) for make in makers]
        self.scores = [0.0] * len(makers)
        self.horizon_blocks = max(1.0, horizon * capacity)
        self.margin = margin
        self.leader = 0

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None:
        for policy in self.live:
            policy.access(key, parent, now, vip)
        self._judge([key], now)

    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None:
        for policy in self.live:
            policy.access_chain(keys, now, vip)
        self._judge(keys, now)

    def candidate(self, key: Hashable, evictable: bool) -> None:
        for policy in self.live:
            policy.candidate(key, evictable)

    def victim(self) -> Hashable | None:
        """The leader's victim; another candidate's where the leader has none (its rules keep every block)."""
        first = self.live[self.leader].victim()
        if first is not None:
            return first
        return next((key for policy in self.live if (key := policy.victim()) is not None), None)

    def remove(self, key: Hashable) -> None:
        for policy in self.live:
            policy.remove(key)

    def _judge(self, keys: Sequence[Hashable], now: float) -> None:
        if not keys:
            return
        fade = math.exp(-len(keys) / self.horizon_blocks)
        for index, shadow in enumerate(self.shadows):
            self.scores[index] = self.scores[index] * fade + shadow.lookup(keys, now)
        best = max(range(len(self.scores)), key=self.scores.__getitem__)
        if self.scores[best] > self.scores[self.leader] * (1 + self.margin):
            self.leader = best
