"""An eviction policy that adapts its balance of recency and frequency to the trace it serves, from the
misses it would have avoided: ARC's learning (Megiddo and Modha, FAST'03) on an LRU-like order, for chains
of prefix blocks. Pure policy, no torch.

The cached blocks are split into two lists by use: `recent` (accessed once since they were cached) and
`frequent` (accessed again), each in order of last access, and each with a ghost list of the keys it lately
evicted (keys only, at most one capacity each). A victim is the older of the two lists' oldest blocks,
where the age of a `recent` block is weighted by `recency_weight`. The weight starts at 1, where the
policy is exactly LRU over leaves. An access to a key in the recent ghosts is a hit the cache would have
had by keeping once-seen blocks longer, so the weight falls (they age slower); one in the frequent ghosts
raises it (reused blocks outlive once-seen ones). The step is ARC's: a capacity's worth of ghost hits
moves the weight across its whole range (`MIN_WEIGHT` to its inverse), scaled up when the other ghost
list is the longer one. So the balance moves continuously with the evidence, and a trace that gives no
evidence either way is served as LRU serves it; no whole order is ever switched for another.

Prefix lookups: only the leading keys of a chain that are cached or in a ghost list teach the weight (a
prefix lookup hits nothing past its first miss, so a ghost there says nothing). As in the LFU, only leaves
are victims (a block whose chain children are cached stays: a child without its parent is useless to a
prefix lookup), and VIP blocks never are.

Cost: O(1) per access. A victim is found by scanning at most `SCAN_LIMIT` blocks from each list's old end
(skipping blocks that are held, VIP or chain heads), and the whole cache only when those are all kept.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import islice

MIN_WEIGHT = 1 / 64  # recency_weight stays within [MIN_WEIGHT, 1 / MIN_WEIGHT]
SCAN_LIMIT = 64  # blocks looked at from each list's old end before scanning the whole cache


def _leading(keys: Sequence[Hashable], present: Callable[[Hashable], bool]) -> int:
    return next((index for index, key in enumerate(keys) if not present(key)), len(keys))


class AdaptivePolicy:
    """See the module docstring. `capacity` (the cache's blocks) sizes the ghost lists and the step."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        # key -> tick of its last access, oldest first
        self.recent: OrderedDict[Hashable, int] = OrderedDict()
        self.frequent: OrderedDict[Hashable, int] = OrderedDict()
        self.recent_ghosts: OrderedDict[Hashable, None] = OrderedDict()
        self.frequent_ghosts: OrderedDict[Hashable, None] = OrderedDict()
        self.log_weight = 0.0  # log of recency_weight
        self.tick = 0  # accesses so far: the clock ages are counted in
        self.evictable: set[Hashable] = set()
        self.vip: set[Hashable] = set()
        self.parents: dict[Hashable, Hashable] = {}
        self.children: dict[Hashable, set[Hashable]] = {}

    @property
    def recency_weight(self) -> float:
        """How much faster a once-seen block ages than a reused one (1: LRU)."""
        return math.exp(self.log_weight)

    def access(self, key: Hashable, parent: Hashable | None, now: float, vip: bool = False) -> None:
        self._touch(key, vip, learn=parent is None or self._cached(parent))
        self._link(key, parent)

    def access_chain(self, keys: Sequence[Hashable], now: float, vip: bool = False) -> None:
        """Tail first, so the head of the chain is the most recent and outlives its tail (as LRU does)."""
        known = _leading(keys, self._known)
        for index in reversed(range(len(keys))):
            self._touch(keys[index], vip, learn=index < known)
        for index in range(1, len(keys)):
            self._link(keys[index], keys[index - 1])

    def candidate(self, key: Hashable, evictable: bool) -> None:
        if evictable and self._cached(key):
            self.evictable.add(key)
        else:
            self.evictable.discard(key)

    def victim(self) -> Hashable | None:
        """The older (recent ages weighted) of the two lists' oldest evictable leaves; while this cache hits
        less than LRU would, a block LRU would not hold, else the oldest leaf (LRU's own order)."""
        old_recent = self._oldest_eligible(islice(self.recent, SCAN_LIMIT))
        old_frequent = self._oldest_eligible(islice(self.frequent, SCAN_LIMIT))
        if old_recent is None and old_frequent is None:
            old_recent, old_frequent = self._oldest_eligible(self.recent), self._oldest_eligible(self.frequent)
        if old_recent is None or old_frequent is None:
            return old_frequent if old_recent is None else old_recent
        recent_age = (self.tick - self.recent[old_recent]) * self.recency_weight
        return old_recent if recent_age >= self.tick - self.frequent[old_frequent] else old_frequent

    def remove(self, key: Hashable) -> None:
        """The block left the cache. A victim's key joins its list's ghosts; a block that was never free to
        evict (a lookup too long for the cache leaves its tail out) was never cached, and is forgotten."""
        evicted = key in self.evictable
        for blocks, ghosts in ((self.recent, self.recent_ghosts), (self.frequent, self.frequent_ghosts)):
            if blocks.pop(key, None) is not None and evicted:
                ghosts[key] = None
                while len(ghosts) > self.capacity:
                    ghosts.popitem(last=False)
        self.evictable.discard(key)
        self.vip.discard(key)
        self.children.pop(key, None)
        parent = self.parents.pop(key, None)
        if parent is not None and parent in self.children:
            self.children[parent].discard(key)

    def _touch(self, key: Hashable, vip: bool, learn: bool) -> None:
        self.tick += 1
        if self.recent.pop(key, None) is not None or key in self.frequent:
            self.frequent.pop(key, None)
        elif key in self.recent_ghosts:  # kept longer, a once-seen block would have hit
            del self.recent_ghosts[key]
            if learn:
                self._learn(-max(1.0, len(self.frequent_ghosts) / (len(self.recent_ghosts) + 1)))
        elif key in self.frequent_ghosts:  # kept longer, a reused block would have hit
            del self.frequent_ghosts[key]
            if learn:
                self._learn(max(1.0, len(self.recent_ghosts) / (len(self.frequent_ghosts) + 1)))
        else:
            self.recent[key] = self.tick
            self._mark_vip(key, vip)
            return
        self.frequent[key] = self.tick
        self._mark_vip(key, vip)

    def _mark_vip(self, key: Hashable, vip: bool) -> None:
        if vip:
            self.vip.add(key)

    def _learn(self, ghost_hits: float) -> None:
        """Move log(recency_weight) by ARC's step per ghost hit: a capacity of hits crosses the range."""
        bound = -math.log(MIN_WEIGHT)
        self.log_weight = min(bound, max(-bound, self.log_weight + ghost_hits * 2 * bound / self.capacity))

    def _cached(self, key: Hashable) -> bool:
        return key in self.recent or key in self.frequent

    def _known(self, key: Hashable) -> bool:
        return self._cached(key) or key in self.recent_ghosts or key in self.frequent_ghosts

    def _link(self, key: Hashable, parent: Hashable | None) -> None:
        if parent is not None and self._cached(parent) and key not in self.parents:
            self.parents[key] = parent
            self.children.setdefault(parent, set()).add(key)

    def _oldest_eligible(self, keys: Iterable[Hashable]) -> Hashable | None:
        return next((key for key in keys
                     if key in self.evictable and key not in self.vip and not self.children.get(key)), None)
