"""Session KV pins: after an agent's turn, its blocks stay held over the expected tool gap, so the next
turn adopts them and computes only its new tokens. Pure policy, no torch.

A pin holds one reference on each block of the finished turn, including the partly filled last block
that prefix hashing cannot find. It ends when its time-to-live runs out, when the session's next turn
adopts it, or under memory pressure (earliest expiry first); then its blocks fall back to normal LRU
eviction, still findable by hash. VIP pins are never released for pressure, only by expiry or adoption, and
their blocks are marked VIP for the eviction policy (engine.kv_cache.policy), which never picks them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.kv_cache.manager import HeldBlocks, KVCacheManager


@dataclass
class Pin:
    held: HeldBlocks
    token_ids: list[int]  # the tokens whose KV the blocks hold, in order (the pin's own list, never changed)
    expires_at: float
    vip: bool


@dataclass
class PinStats:
    pinned: int = 0
    adopted: int = 0  # a turn took over its session's pin
    expired: int = 0
    released_for_memory: int = 0


class SessionPins:
    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.pins: dict[str, Pin] = {}
        self.stats = PinStats()
        self._earliest_expiry = math.inf  # no pin expires before this (it may be stale-early, never late)

    @property
    def num_pinned_blocks(self) -> int:
        return sum(len(pin.held.blocks) for pin in self.pins.values())

    def pin(self, key: str, request_id: str, token_ids: list[int], ttl_s: float, vip: bool, now: float) -> None:
        """Move the finished request's blocks into the session's pin, replacing an older one. The pin keeps
        `token_ids` itself, not a copy: the caller hands over a list of its own (a slice)."""
        self.unpin(key)
        held = self.kv.detach(request_id)
        if vip:  # the eviction policy never picks a VIP session's blocks, pinned or not
            self.kv.pool.accessed(held.blocks, vip=True)
        self.pins[key] = Pin(held, token_ids, now + ttl_s, vip)
        self._earliest_expiry = min(self._earliest_expiry, now + ttl_s)
        self.stats.pinned += 1

    def set_ttl(self, key: str, ttl_s: float, now: float) -> bool:
        """Re-time a live pin (the session learned more about its tool gap); False if none."""
        pin = self.pins.get(key)
        if pin is not None:
            pin.expires_at = now + ttl_s
            self._earliest_expiry = min(self._earliest_expiry, pin.expires_at)
        return pin is not None

    def unpin(self, key: str) -> None:
        pin = self.pins.pop(key, None)
        if pin is not None:
            self.kv.release(pin.held)

    def adopt(self, key: str, request_id: str, token_ids: list[int]) -> Pin | None:
        """Give the session's pinned blocks to its next turn when they hold a prefix of its tokens.

        The request then has KV for `len(pin.token_ids)` tokens. At least one of its tokens is always
        left to compute, so the turn has logits to sample from.
        """
        pin = self.pins.get(key)
        if pin is None:
            return None
        num_pinned = len(pin.token_ids)
        if not 0 < num_pinned < len(token_ids) or token_ids[:num_pinned] != pin.token_ids:
            self.unpin(key)  # the history changed: these blocks are no longer this session's prefix
            return None
        del self.pins[key]
        self.kv.attach(request_id, pin.held)
        self.stats.adopted += 1
        return pin

    def give_back(self, key: str, request_id: str, pin: Pin) -> None:
        """Undo an adoption whose allocation failed: the blocks go back into the pin."""
        pin.held = self.kv.detach(request_id)
        self.pins[key] = pin
        self._earliest_expiry = min(self._earliest_expiry, pin.expires_at)
        self.stats.adopted -= 1

    def expire(self, now: float) -> int:
        """Release the pins whose time is up (in pinning order); a no-op until the earliest one is due."""
        if now < self._earliest_expiry:
            return 0
        expired = [key for key, pin in self.pins.items() if pin.expires_at <= now]
        for key in expired:
            self.unpin(key)
        self._earliest_expiry = min((pin.expires_at for pin in self.pins.values()), default=math.inf)
        self.stats.expired += len(expired)
        return len(expired)

    def release_one_for_memory(self) -> bool:
        """Release the non-VIP pin that expires first; False when there is none."""
        candidates = [(pin.expires_at, key) for key, pin in self.pins.items() if not pin.vip]
        if not candidates:
            return False
        self.unpin(min(candidates)[1])
        self.stats.released_for_memory += 1
        return True
