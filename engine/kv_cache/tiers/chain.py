"""The tiers below the device pool: a bounded host tier (the node's shared memory) and the persistent
stores (disk files, Redis). Demotion goes down (device -> host -> persistent), lookups go host first.
Pure policy and I/O, no torch: blocks are opaque bytes here.

Faults never fail a request: a store that raises StoreUnavailable is skipped (one warning, a metric) for
`retry_s`, then tried again; StoreFull stops demotion into that store, while loads from it go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from engine.kv_cache.policy import EvictionPolicy, LfuPolicy
from engine.kv_cache.tiers.stores import BlockStore, StoreFull, StoreUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")
HOST = "host"


@dataclass
class TierStats:
    """Counters of one tier; a hit ratio is hits / queries, computed by whoever reads them."""

    queries: int = 0  # block lookups that reached this tier
    hits: int = 0
    promoted: int = 0  # blocks read out of this tier (to the device)
    demoted: int = 0  # blocks written into this tier
    skipped: int = 0  # operations skipped because the tier was unavailable
    corrupt: int = 0  # blocks that failed their checks on load (recomputed, then deleted)
    blocks: int = 0
    bytes: int = 0


@dataclass
class Tier:
    store: BlockStore
    stats: TierStats = field(default_factory=TierStats)
    down_until: float = 0.0  # skipped until then (monotonic seconds)
    full: bool = False  # demotion into it stopped

    @property
    def name(self) -> str:
        return self.store.name


class TierChain:
    """Host tier (optional, bounded, evicting by `policy`) above persistent stores (each optional)."""

    def __init__(self, host: BlockStore | None, host_blocks: int, persistent: Sequence[BlockStore],
                 policy: EvictionPolicy | None = None, retry_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.host = Tier(host) if host is not None else None
        self.host_blocks = host_blocks
        self.persistent = [Tier(store) for store in persistent]
        self.policy = policy or LfuPolicy()
        self.retry_s, self.clock = retry_s, clock
        self.host_keys: set[str] = set()  # what this process put in the host tier (its share to evict)

    @property
    def tiers(self) -> list[Tier]:
        return ([self.host] if self.host else []) + self.persistent

    def close(self) -> None:
        for tier in self.tiers:
            tier.store.close()

    def locate(self, key: str) -> Tier | None:
        """The first tier holding the block, counting a query (and a hit) per tier asked."""
        for tier in self.tiers:
            if self._call(tier, partial(tier.store.contains, key), False):
                tier.stats.queries += 1
                tier.stats.hits += 1
                return tier
            tier.stats.queries += not self.is_down(tier)
        return None

    def get(self, tier: Tier, key: str) -> bytes | None:
        data = self._call(tier, lambda: tier.store.get(key), None)
        if data is not None:
            tier.stats.promoted += 1
        return data

    def discard(self, tier: Tier, key: str) -> None:
        """Drop a block that failed its checks, so it is recomputed and stored afresh."""
        tier.stats.corrupt += 1
        self._call(tier, lambda: tier.store.delete(key), None)
        self.host_keys.discard(key)
        self.policy.remove(key)

    def demote(self, key: str, data: bytes, now: float, parent: str | None = None) -> None:
        """A block leaving the device: into the host tier, or straight to the persistent stores."""
        if self.host is None or self.host_blocks == 0:
            self.persist(key, data)
            return
        if key not in self.host_keys:
            self._make_host_room(now)
            if not self._put(self.host, key, data):
                self.persist(key, data)
                return
            self.host_keys.add(key)
            self.policy.access(key, parent, now)
            self.policy.candidate(key, True)

    def persist(self, key: str, data: bytes) -> None:
        """Write a block to every persistent store that lacks it (a session's turn, or a host victim)."""
        for tier in self.persistent:
            if not self._call(tier, partial(tier.store.contains, key), True):
                self._put(tier, key, data)

    def needs_persist(self, key: str) -> bool:
        """Whether some reachable persistent store with room lacks the block."""
        return any(not tier.full and not self.is_down(tier)
                   and not self._call(tier, partial(tier.store.contains, key), True) for tier in self.persistent)

    def _make_host_room(self, now: float) -> None:
        while len(self.host_keys) >= self.host_blocks:
            victim = self.policy.victim()
            if victim is None:
                return
            self._evict_host(str(victim))

    def _evict_host(self, key: str) -> None:
        """A host victim goes down to the persistent stores."""
        host = self.host
        assert host is not None
        self.policy.remove(key)
        self.host_keys.discard(key)
        data = self._call(host, lambda: host.store.get(key), None)
        self._call(host, lambda: host.store.delete(key), None)
        if data is not None:
            self.persist(key, data)

    def _put(self, tier: Tier, key: str, data: bytes) -> bool:
        if tier.full:
            return False
        try:
            self._call(tier, lambda: tier.store.put(key, data), None, reraise_full=True)
        except StoreFull as error:
            tier.full = True
            logger.warning("KV tier %s is full, demotion into it stops: %s", tier.name, error)
            return False
        if self.is_down(tier):
            return False
        tier.stats.demoted += 1
        return True

    def is_down(self, tier: Tier) -> bool:
        return self.clock() < tier.down_until

    def _call(self, tier: Tier, operation: Callable[[], T], fallback: T, reraise_full: bool = False) -> T:
        if self.is_down(tier):
            tier.stats.skipped += 1
            return fallback
        try:
            return operation()
        except StoreFull:
            if reraise_full:
                raise
            return fallback
        except StoreUnavailable as error:
            tier.down_until = self.clock() + self.retry_s
            tier.stats.skipped += 1
            logger.warning("KV tier %s unavailable, skipped for %.0f s: %s", tier.name, self.retry_s, error)
            return fallback

    def refresh_held(self) -> None:
        for tier in self.tiers:
            tier.stats.blocks, tier.stats.bytes = tier.store.held()
