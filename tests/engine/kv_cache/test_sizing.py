"""The KV cache's size: explicit blocks, else explicit bytes, else a share of the available RAM (split between a
deployment's engines), logged at start in tokens of the model."""

from __future__ import annotations

import logging

import psutil
import pytest
import torch

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.validation import read_model_config
from engine.kv_cache.sizing import kv_bytes_per_block, size_kv_cache, weight_bytes
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings

FRACTION = 0.002  # of the available RAM: tens of MiB, small enough for a test


@pytest.fixture
def sized_from_memory(monkeypatch: pytest.MonkeyPatch) -> EngineSettings:
    """The shipped defaults, with the size the test suite fixes (tests/conftest.py) taken away."""
    monkeypatch.delenv("AGENTSERVE_ENGINE_KV_CACHE_BYTES", raising=False)
    monkeypatch.delenv("AGENTSERVE_ENGINE_NUM_KV_BLOCKS", raising=False)
    return EngineSettings(kv_cache_memory_fraction=FRACTION)


def blocks_between(fraction: float, block_bytes: int, engines: int = 1, set_aside: int = 0) -> tuple[int, int]:
    """The block counts `fraction` of the available RAM gives, allowing RAM to change by 10% meanwhile."""
    available = psutil.virtual_memory().available
    return (int(0.9 * available * fraction - set_aside) // engines // block_bytes,
            int(1.1 * available * fraction) // engines // block_bytes)


def test_the_shipped_default_is_a_share_of_the_available_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTSERVE_ENGINE_KV_CACHE_BYTES", raising=False)
    settings = EngineSettings()
    assert settings.num_kv_blocks is None and settings.kv_cache_bytes is None
    assert 0 < settings.kv_cache_memory_fraction < 1 and 0 < settings.kv_cache_device_memory_fraction < 1


def test_blocks_then_bytes_then_memory(sized_from_memory: EngineSettings) -> None:
    config, _ = read_model_config("tiny")
    block_bytes = kv_bytes_per_block(config, 16, torch.float32)
    low, high = blocks_between(FRACTION, block_bytes)
    assert low <= size_kv_cache(config, sized_from_memory).num_blocks <= high
    by_bytes = sized_from_memory.model_copy(update={"kv_cache_bytes": 300 * block_bytes})
    assert size_kv_cache(config, by_bytes).num_blocks == 300
    by_blocks = by_bytes.model_copy(update={"num_kv_blocks": 7})
    assert size_kv_cache(config, by_blocks).num_blocks == 7


def test_engines_sharing_a_host_split_the_share_and_set_their_weights_aside(
        sized_from_memory: EngineSettings) -> None:
    config, _ = read_model_config("tiny")
    block_bytes = kv_bytes_per_block(config, 16, torch.float32)
    weights = weight_bytes(config, torch.float32)
    low, high = blocks_between(FRACTION, block_bytes, engines=4, set_aside=4 * weights)
    size = size_kv_cache(config, sized_from_memory, engines=4, weights_loaded=False)
    assert low <= size.num_blocks <= high
    assert "split 4 ways" in size.describe("tiny")


def test_an_engine_logs_its_cache_in_tokens_of_its_model(sized_from_memory: EngineSettings,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="engine.kv_cache.sizing"):
        engine = LLMEngine("tiny", sized_from_memory)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache:")]
    assert line.startswith(f"KV cache: {engine.num_blocks * 16:,} tokens of tiny (")
    assert "available RAM" in line
    assert engine.settings.num_kv_blocks == engine.num_blocks


def test_a_deployment_fixes_the_size_once_for_its_workers(sized_from_memory: EngineSettings) -> None:
    """The coordinator sizes the workers' caches before they start: each worker and the coordinator's request
    checks agree on the block count, however the available RAM moves while the workers load."""
    engine = WorkerEngine("tiny", sized_from_memory, DeploymentSettings(prefill=1, decode=1, transport="shm"))
    try:
        blocks = engine.settings.num_kv_blocks
        assert blocks is not None and engine.validator.num_blocks == blocks
        [result] = engine.generate([[1, 5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))
        assert result.finish_reason in ("stop", "length")
    finally:
        engine.shutdown()

