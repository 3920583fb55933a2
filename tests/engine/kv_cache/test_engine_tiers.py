"""The engine's KV tiers on the tiny model: exact block contents through every tier, eviction that demotes
and a miss that loads (greedy output equal to a cold run), a corrupted stored block, Redis killed mid-run."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.manager import hash_block_tokens
from engine.kv_cache.settings import KVCacheSettings
from engine.kv_cache.tiers.engine import TierHooks
from tests.engine.kv_cache.conftest import OwnRedis, opened

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
BLOCK = 4
PROMPT_A = list(range(3, 33))  # 30 tokens: 7 full blocks
PROMPT_B = list(range(500, 540))  # 40 tokens: fills a 12-block pool, evicting A


def make_engine(num_blocks: int = 12, **kv: Any) -> LLMEngine:
    return opened(LLMEngine("tiny", EngineSettings(num_kv_blocks=num_blocks, block_size=BLOCK,
                                                   kv_cache=KVCacheSettings(**kv))))


def hooks(engine: LLMEngine) -> TierHooks:
    assert engine.tiers is not None
    return engine.tiers


def run(engine: LLMEngine, prompt: list[int]) -> Completion:
    return engine.generate([prompt], GREEDY)[0]


def block_kv(engine: LLMEngine, block_id: int) -> list[torch.Tensor]:
    return [engine.runner.read_kv(layer, [block_id], BLOCK).clone() for layer in range(engine.config.num_hidden_layers)]


def chain_hashes(tokens: list[int]) -> list[int]:
    hashes: list[int] = []
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[start:start + BLOCK]))
    return hashes


def tier_settings(kind: str, tmp_path: Path, redis: str) -> dict[str, Any]:
    settings: dict[str, dict[str, Any]] = {"host": {"host_blocks": 8, "host_path": tmp_path / "host"},
                                           "disk": {"disk_path": tmp_path / "disk"}, "redis": {"redis_url": redis}}
    return settings[kind]


@pytest.mark.parametrize("kind", ["host", "disk", "redis"])
def test_a_block_round_trips_through_each_tier_exactly(kind: str, tmp_path: Path, own_redis: OwnRedis) -> None:
    engine = make_engine(**tier_settings(kind, tmp_path, own_redis.url))
    torch.manual_seed(0)
    for cache in engine.runner.kv_caches:
        cache.normal_()
    expected = block_kv(engine, 3)
    tiers = hooks(engine).tiers
    tiers.demote(0xABC, 3)
    for cache in engine.runner.kv_caches:
        cache.zero_()
    assert tiers.loadable([0xABC, 0xDEF]) == 1
    assert tiers.load(0xABC, 5)
    assert all(torch.equal(got, want) for got, want in zip(block_kv(engine, 5), expected, strict=True))
    assert tiers.chain.tiers[0].name == kind and tiers.chain.tiers[0].stats.promoted == 1


def test_a_block_travels_host_then_disk_and_redis(tmp_path: Path, own_redis: OwnRedis) -> None:
    engine = make_engine(host_blocks=1, host_path=tmp_path / "host", disk_path=tmp_path / "disk",
                         redis_url=own_redis.url)
    for cache in engine.runner.kv_caches:
        cache.normal_()
    first, second = block_kv(engine, 1), block_kv(engine, 2)
    tiers = hooks(engine).tiers
    tiers.demote(1, 1)
    tiers.demote(2, 2)  # the host holds one block: block 1 goes down to disk and Redis
    host, disk, redis_tier = tiers.chain.tiers
    assert (host.stats.demoted, disk.stats.demoted, redis_tier.stats.demoted) == (2, 1, 1)
    assert tiers.load(2, 7) and tiers.load(1, 8)
    assert (host.stats.promoted, disk.stats.promoted) == (1, 1)
    disk.store.delete(tiers._key(1))
    assert tiers.load(1, 9) and redis_tier.stats.promoted == 1
    for block_id, want in ((7, second), (8, first), (9, first)):
        assert all(torch.equal(g, w) for g, w in zip(block_kv(engine, block_id), want, strict=True))


def test_evicted_prefix_is_demoted_then_loaded_not_recomputed(tmp_path: Path) -> None:
    cold = run(make_engine(num_blocks=64), PROMPT_A)
    engine = make_engine(host_blocks=32, host_path=tmp_path / "host")
    run(engine, PROMPT_A)
    run(engine, PROMPT_B)  # needs the whole pool: A's cached blocks are evicted, so demoted
    host = hooks(engine).tiers.chain.tiers[0]
    on_device = [h in engine.kv.pool.cached for h in chain_hashes(PROMPT_A[:28])]
    assert on_device == sorted(on_device, reverse=True) and sum(on_device) < 7  # a prefix stays, the tail went
    again = run(engine, PROMPT_A)
    assert again.num_cached_tokens == 28 and again.token_ids == cold.token_ids
    assert hooks(engine).tiers.decision.loaded == host.stats.promoted == 7 - sum(on_device)


def test_a_corrupted_stored_block_is_recomputed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cold = run(make_engine(num_blocks=64), PROMPT_A)
    engine = make_engine(disk_path=tmp_path / "disk")
    run(engine, PROMPT_A)
    run(engine, PROMPT_B)
    tiers = hooks(engine).tiers
    on_device = sum(h in engine.kv.pool.cached for h in chain_hashes(PROMPT_A[:28]))
    first_stored = chain_hashes(PROMPT_A[:28])[on_device]
    path = tiers.chain.tiers[0].store._path(tiers._key(first_stored))  # type: ignore[attr-defined]
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside layer 0's payload: its checksum fails
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.engine"):
        again = run(engine, PROMPT_A)
    assert again.num_cached_tokens == on_device * BLOCK and again.token_ids == cold.token_ids
    assert tiers.chain.tiers[0].stats.corrupt == 1 and not path.exists()
    assert any("failed its checks" in record.message for record in caplog.records)


def test_redis_killed_mid_run_fails_no_request(own_redis: OwnRedis, caplog: pytest.LogCaptureFixture) -> None:
    cold = run(make_engine(num_blocks=64), PROMPT_A)
    engine = make_engine(redis_url=own_redis.url)
    run(engine, PROMPT_A)
    own_redis.kill()
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.chain"):
        run(engine, PROMPT_B)  # evictions try to demote into the dead Redis
        again = run(engine, PROMPT_A)
    assert again.token_ids == cold.token_ids and again.num_cached_tokens < 28
    redis_tier = hooks(engine).tiers.chain.tiers[0]
    assert redis_tier.stats.skipped > 0
    assert len([r for r in caplog.records if "unavailable" in r.message]) == 1


def test_a_full_disk_stops_demotion_not_serving(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cold = [run(make_engine(num_blocks=64), prompt) for prompt in (PROMPT_A, PROMPT_B, PROMPT_A)]
    engine = make_engine(disk_path=tmp_path / "disk", disk_max_bytes=30_000)  # room for 13 blocks of 2.2 KB
    with caplog.at_level(logging.WARNING, logger="engine.kv_cache.tiers.chain"):
        served = [run(engine, prompt) for prompt in (PROMPT_A, PROMPT_B, PROMPT_A)]
    disk = hooks(engine).tiers.chain.tiers[0]
    assert [r.token_ids for r in served] == [r.token_ids for r in cold]
    blocks, nbytes = disk.store.held()
    assert disk.full and disk.stats.demoted == blocks > 0 and 30_000 - nbytes < nbytes / blocks
    assert len([r for r in caplog.records if "full" in r.message]) == 1


def test_a_tier_slower_than_prefill_is_not_loaded_from(tmp_path: Path) -> None:
    cold = run(make_engine(num_blocks=64), PROMPT_A)
    engine = make_engine(host_blocks=32, host_path=tmp_path / "host")
    run(engine, PROMPT_A)
    run(engine, PROMPT_B)
    decision = hooks(engine).tiers.decision
    decision.bytes_per_s["host"] = 1.0  # as if measured: one byte a second, far slower than any prefill
    on_device = sum(h in engine.kv.pool.cached for h in chain_hashes(PROMPT_A[:28]))
    again = run(engine, PROMPT_A)
    assert again.token_ids == cold.token_ids and again.num_cached_tokens == on_device * BLOCK
    assert decision.loaded == 0 and decision.recomputed == 7 - on_device
