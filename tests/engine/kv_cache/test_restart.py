"""A session continued by a restarted engine (or another replica sharing the store): its KV is loaded from
disk or from a real Redis, not recomputed, `cached_tokens` says so, and greedy output equals a cold run."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.kv_cache.settings import KVCacheSettings
from tests.engine.kv_cache.conftest import OwnRedis, opened
from tests.engine.kv_cache.test_session_kv import run_turn

BLOCK = 8
SESSION = SessionRef("agent-restart", ttl_s=60.0)


def make_engine(kv: KVCacheSettings | None = None) -> LLMEngine:
    return opened(LLMEngine("tiny", EngineSettings(num_kv_blocks=64, block_size=BLOCK,
                                                   kv_cache=kv or KVCacheSettings())))


@pytest.mark.parametrize("store", ["disk", "redis"])
def test_a_restarted_engine_loads_the_session_kv(store: str, tmp_path: Path, own_redis: OwnRedis) -> None:
    kv = KVCacheSettings(disk_path=tmp_path / "disk") if store == "disk" else KVCacheSettings(redis_url=own_redis.url)
    first_prompt = list(range(1, 60))
    before = make_engine(kv)
    first = run_turn(before, first_prompt, SESSION)
    if store == "disk":
        before.shutdown()  # a restart; without it (Redis), a replica sharing the store reads the turn's write-through
    del before

    second_prompt = [*first_prompt, *first.token_ids, 901, 902, 903]
    after = make_engine(kv)  # a new process would see the same: nothing survives but the store
    second = run_turn(after, second_prompt, SESSION)
    computed_before = len(first_prompt) + len(first.token_ids) - 1  # the last sampled token has no KV
    assert second.num_cached_tokens == computed_before // BLOCK * BLOCK
    assert after.tiers is not None and after.tiers.tiers.decision.loaded == computed_before // BLOCK
    stats = after.kv_tier_stats()
    assert stats is not None and stats["tiers"][store]["promoted"] == computed_before // BLOCK

    cold = run_turn(make_engine(), second_prompt, None)
    assert cold.num_cached_tokens == 0 and second.token_ids == cold.token_ids


def test_another_namespace_finds_nothing(tmp_path: Path) -> None:
    """A store shared by engines of different block sizes (another fingerprint) serves none of them."""
    kv = KVCacheSettings(disk_path=tmp_path / "disk")
    prompt = list(range(1, 60))
    writer = make_engine(kv)
    run_turn(writer, prompt, SESSION)
    other = LLMEngine("tiny", EngineSettings(num_kv_blocks=64, block_size=16, kv_cache=kv))
    assert run_turn(other, [*prompt, 5], None).num_cached_tokens == 0


def test_a_cache_salt_still_separates_prefixes_after_a_restart(tmp_path: Path) -> None:
    """Blocks written under one salt are named by salted hashes in the persistent tier: a restarted engine
    serves them to that salt only."""
    kv = KVCacheSettings(disk_path=tmp_path / "disk")
    prompt = list(range(1, 60))

    def cached(engine: LLMEngine, salt: str | None) -> int:
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, cache_salt=salt)
        return engine.generate([[*prompt, 5]], params)[0].num_cached_tokens

    writer = make_engine(kv)
    assert cached(writer, "alice") == 0
    writer.shutdown()
    after = make_engine(kv)
    assert cached(after, "bob") == 0 and cached(after, None) == 0
    assert cached(after, "alice") == len(prompt) // BLOCK * BLOCK
    assert after.tiers is not None and after.tiers.tiers.decision.loaded == len(prompt) // BLOCK
