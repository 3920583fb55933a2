"""Eviction order of the improved LFU and of LRU on hand-built access sequences."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from engine.kv_cache.policy import EvictionPolicy, LfuPolicy, LfuWeights, LruPolicy, make_policy


def _evict_all(policy: EvictionPolicy) -> list[Hashable]:
    order = []
    while (victim := policy.victim()) is not None:
        order.append(victim)
        policy.remove(victim)
    return order


def _free(policy: EvictionPolicy, *keys: str) -> None:
    for key in keys:
        policy.candidate(key, True)


def test_decay_lets_recent_single_access_outlive_old_frequent_ones() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=100, neighbour_share=0, prefix_share=0))
    for _ in range(3):
        policy.access("old", None, now=0.0)
    policy.access("new", None, now=1000.0)  # 3 x exp(-10) < 1
    _free(policy, "old", "new")
    assert _evict_all(policy) == ["old", "new"]


def test_without_elapsed_time_frequency_decides() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=100, neighbour_share=0, prefix_share=0))
    for _ in range(3):
        policy.access("often", None, now=0.0)
    policy.access("once", None, now=1.0)  # exp(0.01) < 3
    _free(policy, "often", "once")
    assert _evict_all(policy) == ["once", "often"]


def test_parent_shares_in_its_child_accesses() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=1e6, neighbour_share=2, prefix_share=0))
    policy.access_chain(["head", "tail"], now=0.0)  # head: 1 + 2 x 1
    policy.access("lone", None, now=0.0)
    policy.access("lone", None, now=0.0)  # lone: 2
    _free(policy, "head", "tail", "lone")
    assert _evict_all(policy) == ["tail", "lone", "head"]


def test_without_neighbour_share_the_lone_frequent_block_wins() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=1e6, neighbour_share=0, prefix_share=0))
    policy.access_chain(["head", "tail"], now=0.0)
    policy.access("lone", None, now=0.0)
    policy.access("lone", None, now=0.0)
    _free(policy, "head", "tail", "lone")
    assert _evict_all(policy)[-1] == "lone"


def test_a_prefix_shared_by_two_sequences_outlives_one_reused_by_one() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=1e6, neighbour_share=1, prefix_share=1))
    policy.access_chain(["shared", "x"], now=0.0)
    policy.access_chain(["shared", "y"], now=0.0)  # a second sequence branches off "shared"
    policy.access_chain(["single", "z"], now=0.0)
    policy.access_chain(["single", "z"], now=0.0)  # the same sequence again: no new branch
    _free(policy, "shared", "x", "y", "single", "z")
    order = _evict_all(policy)
    assert order.index("single") < order.index("shared")
    assert policy.blocks == {}


@pytest.mark.parametrize("name", ["adaptive", "lfu", "lru"])
def test_vip_blocks_are_never_victims(name: str) -> None:
    policy = make_policy(name, capacity=4)  # type: ignore[arg-type]
    policy.access("vip", None, now=0.0, vip=True)
    for _ in range(5):
        policy.access("plain", None, now=10.0)
    _free(policy, "vip", "plain")
    assert _evict_all(policy) == ["plain"]
    assert policy.victim() is None


@pytest.mark.parametrize("name", ["adaptive", "lfu", "lru"])
def test_held_blocks_are_not_victims(name: str) -> None:
    policy = make_policy(name, capacity=4)  # type: ignore[arg-type]
    policy.access("held", None, now=0.0)
    policy.access("free", None, now=5.0)
    _free(policy, "held", "free")
    policy.candidate("held", False)
    assert policy.victim() == "free"
    policy.remove("free")
    assert policy.victim() is None


def test_lru_evicts_least_recent_chain_tail_first() -> None:
    policy = LruPolicy()
    policy.access_chain(["a0", "a1", "a2"], now=0.0)
    policy.access_chain(["b0", "b1"], now=1.0)
    _free(policy, "a0", "a1", "a2", "b0", "b1")
    assert _evict_all(policy) == ["a2", "a1", "a0", "b1", "b0"]


def test_lfu_order_survives_rescaling_far_into_the_future() -> None:
    policy = LfuPolicy(LfuWeights(decay_s=1.0, neighbour_share=0, prefix_share=0))
    policy.access("a", None, now=0.0)
    policy.access("b", None, now=1000.0)  # exponent 1000: the origin moves, scores rescale
    policy.access("b", None, now=1000.0)
    policy.access("a", None, now=1000.5)
    _free(policy, "a", "b")
    assert _evict_all(policy) == ["a", "b"]  # a: exp(0.5) < b: 2


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")  # type: ignore[arg-type]

