"""Stores and the tier chain with exact bytes: demotion device -> host -> disk and Redis, lookups host
first, a full disk, and Redis killed mid-run."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from engine.kv_cache.policy import LfuPolicy, LfuWeights
from engine.kv_cache.tiers.chain import TierChain
from engine.kv_cache.tiers.stores import FileStore, RedisStore, StoreFull
from tests.engine.kv_cache.conftest import OwnRedis


def _block(index: int) -> bytes:
    return os.urandom(64) + index.to_bytes(4, "big")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_file_store_round_trips_and_counts(tmp_path: Path) -> None:
    store = FileStore("disk", tmp_path / "disk")
    data = _block(1)
    store.put("ns:0001", data)
    assert store.get("ns:0001") == data and store.contains("ns:0001")
    assert store.held() == (1, len(data))
    assert FileStore("disk", tmp_path / "disk").held() == (1, len(data))  # a restart counts what is there
    store.delete("ns:0001")
    assert store.get("ns:0001") is None and store.held() == (0, 0)


def test_redis_store_round_trips(redis_url: str) -> None:
    store = RedisStore(redis_url, ttl_s=60)
    data = _block(2)
    store.put("agentserve-kv-test:a", data)
    assert store.get("agentserve-kv-test:a") == data
    store.delete("agentserve-kv-test:a")
    assert not store.contains("agentserve-kv-test:a")


def test_host_overflow_demotes_the_lfu_victim_to_disk_and_redis(tmp_path: Path, redis_url: str) -> None:
    host, disk = FileStore("host", tmp_path / "host"), FileStore("disk", tmp_path / "disk")
    redis_store = RedisStore(redis_url, ttl_s=60)
    chain = TierChain(host, 2, [disk, redis_store], LfuPolicy(LfuWeights(decay_s=1e6)))
    blocks = {f"t1:{i}": _block(i) for i in range(3)}
    chain.demote("t1:0", blocks["t1:0"], now=0.0)
    chain.demote("t1:1", blocks["t1:1"], now=0.0)
    chain.policy.access("t1:1", None, now=0.0)  # t1:1 is used more: t1:0 is the victim
    chain.demote("t1:2", blocks["t1:2"], now=0.0)
    assert not host.contains("t1:0") and disk.get("t1:0") == blocks["t1:0"]
    assert redis_store.get("t1:0") == blocks["t1:0"]
    for key, data in blocks.items():
        tier = chain.locate(key)
        assert tier is not None and chain.get(tier, key) == data
        assert tier.name == ("disk" if key == "t1:0" else "host")
    assert chain.host is not None and chain.host.stats.demoted == 3 and chain.host.stats.hits == 2


def test_without_host_tier_demotion_goes_to_the_persistent_stores(tmp_path: Path) -> None:
    disk = FileStore("disk", tmp_path / "disk")
    chain = TierChain(None, 0, [disk])
    chain.demote("k", b"abc", now=0.0)
    assert disk.get("k") == b"abc" and chain.persistent[0].stats.demoted == 1


def test_full_disk_stops_demotion_but_not_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    disk = FileStore("disk", tmp_path / "disk", max_bytes=100)
    chain = TierChain(None, 0, [disk])
    chain.demote("a", b"x" * 80, now=0.0)
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.chain"):
        chain.demote("b", b"y" * 80, now=0.0)
        chain.demote("c", b"z" * 10, now=0.0)  # stopped, though it would fit
    assert chain.persistent[0].full and not disk.contains("b") and not disk.contains("c")
    assert len([r for r in caplog.records if "full" in r.message]) == 1
    tier = chain.locate("a")
    assert tier is not None and chain.get(tier, "a") == b"x" * 80
    with pytest.raises(StoreFull):
        disk.put("d", b"w" * 80)


def test_redis_killed_mid_run_is_skipped_with_one_warning(tmp_path: Path, own_redis: OwnRedis,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    disk = FileStore("disk", tmp_path / "disk")
    redis_store = RedisStore(own_redis.url, ttl_s=60, timeout_s=0.5)
    chain = TierChain(None, 0, [disk, redis_store], retry_s=30.0, clock=clock)
    chain.demote("before", b"1", now=0.0)
    assert redis_store.get("before") == b"1"
    own_redis.kill()
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.chain"):
        for index in range(5):
            chain.demote(f"after{index}", b"2", now=0.0)
            assert chain.locate(f"after{index}") is not None  # served from disk
        assert chain.locate("only-in-redis") is None
    redis_tier = chain.persistent[1]
    assert len([r for r in caplog.records if "unavailable" in r.message]) == 1
    assert redis_tier.stats.skipped >= 5 and disk.get("after4") == b"2"
    clock.now = 31.0  # retried after retry_s: still down, one more warning
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.chain"):
        chain.demote("later", b"3", now=0.0)
    assert len([r for r in caplog.records if "unavailable" in r.message]) == 2
