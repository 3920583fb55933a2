"""The adaptive eviction policy against LRU on synthetic traces of three shapes: it must hit at least as
often as LRU at every size on each (hit counts are deterministic: seeded traces, no clock)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import pytest

from engine.kv_cache.adaptive import AdaptivePolicy, ShadowCache
from engine.kv_cache.policy import EvictionPolicy, LruPolicy, make_policy

Lookup = tuple[float, tuple[Hashable, ...]]  # (seconds, chained block keys, head first)


def recency_heavy(seed: int = 1) -> list[Lookup]:
    """Agent sessions: each grows its chain over a burst of turns, then ends; a few sessions at a time.
    Early sessions run many turns (frequent blocks) that never come back."""
    rng, lookups, now = random.Random(seed), [], 0.0
    for session in range(120):
        chain: list[Hashable] = []
        for _ in range(30 if session < 10 else rng.randint(3, 8)):
            chain += [(session, len(chain) + i) for i in range(rng.randint(1, 3))]
            lookups.append((now, tuple(chain)))
            now += 1.0
    return _interleave(lookups, rng)


def frequency_heavy(seed: int = 2) -> list[Lookup]:
    """A few popular system prompts (Zipf) shared by many requests, among long one-off documents."""
    rng, lookups = random.Random(seed), []
    for step in range(1500):
        if rng.random() < 0.5:
            prompt = min(int(rng.paretovariate(1.2)), 12)
            lookups.append((float(step), tuple(("prompt", prompt, i) for i in range(4))))
        else:
            lookups.append((float(step), tuple(("doc", step, i) for i in range(rng.randint(4, 12)))))
    return lookups


def scan(seed: int = 3) -> list[Lookup]:
    """A loop over more chains than the cache holds (LRU misses them all), beside a small hot set."""
    rng, lookups = random.Random(seed), []
    for step in range(1500):
        if rng.random() < 0.3:
            lookups.append((float(step), (("hot", rng.randrange(5)),)))
        else:
            item = step % 90
            lookups.append((float(step), (("loop", item, 0), ("loop", item, 1))))
    return lookups


def _interleave(lookups: list[Lookup], rng: random.Random) -> list[Lookup]:
    """Shuffle neighbouring lookups a little, so sessions overlap, and keep each chain's turns in order."""
    keyed = sorted(enumerate(lookups), key=lambda item: item[0] + rng.uniform(0, 40))
    by_session: dict[Hashable, list[Lookup]] = {}
    for _, lookup in sorted(enumerate(lookups)):
        by_session.setdefault(lookup[1][0][0], []).append(lookup)  # type: ignore[index]
    order = [lookup[1][0][0] for _, lookup in keyed]  # type: ignore[index]
    return [(float(step), by_session[s].pop(0)[1]) for step, s in enumerate(order)]


def hits(lookups: Sequence[Lookup], policy: EvictionPolicy, capacity: int) -> int:
    cache = ShadowCache(policy, capacity)
    return sum(cache.lookup(keys, now) for now, keys in lookups)


SHAPES = {"recency-heavy": recency_heavy, "frequency-heavy": frequency_heavy, "scan": scan}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("capacity", [24, 60, 150])
def test_adaptive_hits_at_least_as_often_as_lru(shape: str, capacity: int) -> None:
    lookups = SHAPES[shape]()
    adaptive = hits(lookups, make_policy("adaptive", capacity=capacity), capacity)
    assert adaptive >= hits(lookups, LruPolicy(), capacity)


def test_it_follows_frequency_where_frequency_pays() -> None:
    lookups = frequency_heavy()
    policy = AdaptivePolicy(60)
    adaptive = hits(lookups, policy, 60)
    assert policy.leader != 0  # an LFU candidate leads, not LRU
    assert adaptive > hits(lookups, LruPolicy(), 60)


def test_the_adaptive_policy_needs_the_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        make_policy("adaptive")


def test_its_lru_evicts_only_leaves() -> None:
    """A chain cached head first: plain LRU would evict the head and strand the tail; this one keeps it."""
    policy = make_policy("adaptive", capacity=4)
    for parent, key in ((None, "head"), ("head", "mid"), ("mid", "tail")):
        policy.access(key, parent, now=0.0)
        policy.candidate(key, True)
    order = []
    while (victim := policy.victim()) is not None:
        order.append(victim)
        policy.remove(victim)
    assert order == ["tail", "mid", "head"]
