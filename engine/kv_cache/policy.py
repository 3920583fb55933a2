"""Which cached block to evict: the seed's improved LFU, or LRU (and `adaptive`, which learns the balance of
recency and frequency from the trace: engine/kv_cache/adaptive.py). Pure policy, no torch.

LFU score of a block (all terms decay by exp(-age / decay_s), so recency is part of frequency):
    score = accesses + neighbour_share x accesses of its chain children + prefix_share x new sequences
A parent gains from every access to a child, and from each new sequence that branches off it (a shared
prefix). Only leaves are victims: a block whose chain children are still tracked stays, since a child
without its parent is useless to a prefix lookup. VIP blocks are never victims.

Scores live in a time-invariant domain: an event at time t adds exp((t - origin) / decay_s), so ordering
two blocks needs no clock and a heap with lazy invalidation finds the lowest score in O(log n). The
origin moves forward (all scores rescaled) before the weights overflow.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

PolicyName = Literal["adaptive", "lfu", "lru"]
RESCALE_EXPONENT = 600.0  # exp(600) ~ 1e260: rescale before float64 overflows


class EvictionPolicy(Protocol):
    """Tracks cached blocks; `candidate` ones (nobody holds them) may be chosen as victims."""

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None: ...
    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None: ...
    def candidate(self, key: Hashable, evictable: bool) -> None: ...
    def victim(self) -> Hashable | None: ...
    def remove(self, key: Hashable) -> None: ...


@dataclass(frozen=True)
class LfuWeights:
    decay_s: float = 600.0  # seconds: a score falls by e without access for this long
    neighbour_share: float = 1.0  # share of a child's accesses credited to its parent
    prefix_share: float = 1.0  # credit per new sequence branching off a block


@dataclass
class _Block:
    parent: Hashable | None
    accesses: float = 0.0
    children: float = 0.0
    branches: float = 0.0
    vip: bool = False
    evictable: bool = False
    version: int = 0
    child_keys: set[Hashable] = field(default_factory=set)


class LfuPolicy:
    def __init__(self, weights: LfuWeights | None = None) -> None:
        self.weights = weights or LfuWeights()
        self.blocks: dict[Hashable, _Block] = {}
        self.heap: list[tuple[float, int, Hashable]] = []
        self.origin = 0.0

    def score(self, key: Hashable) -> float:
        block = self.blocks[key]
        w = self.weights
        return block.accesses + w.neighbour_share * block.children + w.prefix_share * block.branches

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None:
        weight = self._weight(now)
        block = self.blocks.get(key)
        if block is None:
            block = self.blocks[key] = _Block(parent)
        block.accesses += weight
        block.vip = block.vip or vip
        self._push(key, block)
        above = self.blocks.get(parent) if parent is not None else None
        if above is not None:
            above.children += weight
            if key not in above.child_keys:
                above.child_keys.add(key)
                above.branches += weight if len(above.child_keys) > 1 else 0.0
            self._push(parent, above)

    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None:
        """One sequence's blocks, head first (each one's parent is the one before it)."""
        parent = None
        for key in keys:
            self.access(key, parent, now, vip)
            parent = key

    def candidate(self, key: Hashable, evictable: bool) -> None:
        block = self.blocks.get(key)
        if block is not None and block.evictable != evictable:
            block.evictable = evictable
            self._push(key, block)

    def victim(self) -> Hashable | None:
        """The evictable non-VIP block of lowest score, or None; it stays tracked until `remove`."""
        while self.heap:
            _, version, key = self.heap[0]
            block = self.blocks.get(key)
            if block is not None and block.version == version and self._eligible(block):
                return key
            heapq.heappop(self.heap)
        return None

    def remove(self, key: Hashable) -> None:
        block = self.blocks.pop(key, None)
        parent = self.blocks.get(block.parent) if block is not None and block.parent is not None else None
        if parent is not None:
            parent.child_keys.discard(key)
            self._push(block.parent, parent)  # type: ignore[union-attr]

    @staticmethod
    def _eligible(block: _Block) -> bool:
        return block.evictable and not block.vip and not block.child_keys

    def _push(self, key: Hashable, block: _Block) -> None:
        block.version += 1
        if self._eligible(block):
            heapq.heappush(self.heap, (self.score(key), block.version, key))

    def _weight(self, now: float) -> float:
        exponent = (now - self.origin) / self.weights.decay_s
        if exponent > RESCALE_EXPONENT:
            self._rescale(now)
            exponent = 0.0
        return math.exp(exponent)

    def _rescale(self, now: float) -> None:
        factor = math.exp(-(now - self.origin) / self.weights.decay_s)
        self.origin = now
        self.heap.clear()
        for key, block in self.blocks.items():
            block.accesses *= factor
            block.children *= factor
            block.branches *= factor
            self._push(key, block)


class LruPolicy:
    """Least recently accessed first."""

    def __init__(self) -> None:
        self.order: OrderedDict[Hashable, bool] = OrderedDict()  # key -> evictable (VIP never)
        self.vip: set[Hashable] = set()

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None:
        self.order[key] = self.order.get(key, False)
        self.order.move_to_end(key, last=True)
        if vip:
            self.vip.add(key)

    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None:
        """Tail first, so the head of the chain is the most recent and outlives its tail (as vLLM frees)."""
        for key in reversed(keys):
            self.access(key, None, now, vip)

    def candidate(self, key: Hashable, evictable: bool) -> None:
        if key in self.order:
            self.order[key] = evictable

    def victim(self) -> Hashable | None:
        return next((k for k, ok in self.order.items() if ok and k not in self.vip), None)

    def remove(self, key: Hashable) -> None:
        self.order.pop(key, None)
        self.vip.discard(key)


def make_policy(name: PolicyName, weights: LfuWeights | None = None, capacity: int = 0) -> EvictionPolicy:
    """`weights` are the LFU's; `capacity` (blocks of the cache the policy serves) sizes the adaptive policy's
    ghost lists and its learning step."""
    if name == "adaptive":
        from engine.kv_cache.adaptive import AdaptivePolicy

        if capacity <= 0:
            raise ValueError("the adaptive eviction policy needs the cache's capacity in blocks")
        return AdaptivePolicy(capacity)
    if name == "lfu":
        return LfuPolicy(weights)
    if name == "lru":
        return LruPolicy()
    raise ValueError(f"unknown eviction policy {name!r}: adaptive, lfu or lru")
