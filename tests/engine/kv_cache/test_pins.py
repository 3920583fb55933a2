"""Session pins expire when their time is up, whichever way their expiry last moved."""

from __future__ import annotations

from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.pins import SessionPins


def pinned(pins: SessionPins, key: str, now: float, ttl_s: float) -> None:
    tokens = list(range(100 * len(pins.pins), 100 * len(pins.pins) + 6))
    assert pins.kv.allocate_slots(key, tokens, 0, len(tokens)) is not None
    pins.pin(key, key, tokens, ttl_s, False, now)


def test_expiry_follows_pins_ttls_adoption_and_give_back() -> None:
    pins = SessionPins(KVCacheManager(num_blocks=16, block_size=4))
    pinned(pins, "a", 0.0, 10.0)
    pinned(pins, "b", 0.0, 20.0)
    assert pins.expire(9.0) == 0 and pins.kv.num_free_blocks == 12
    assert pins.set_ttl("b", 2.0, now=1.0)  # b now expires at 3, before a
    assert pins.expire(3.0) == 1 and set(pins.pins) == {"a"}
    pin = pins.adopt("a", "turn-2", [*range(6), 7])
    assert pin is not None and pins.expire(100.0) == 0
    pins.give_back("a", "turn-2", pin)  # the turn found no room: the pin is back, with its expiry
    assert pins.expire(9.5) == 0 and pins.expire(10.0) == 1
    assert pins.pins == {} and pins.kv.num_free_blocks == 16 and pins.stats.expired == 2
