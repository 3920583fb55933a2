from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from engine.config import EngineSettings
from engine.core.validation import num_kv_blocks, read_model_config
from engine.kv_cache.sizing import kv_bytes_per_block


def test_yaml_then_environment_then_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("block_size: 8\nmax_num_seqs: 3\nmax_num_batched_tokens: 100\n")
    monkeypatch.setenv("AGENTSERVE_ENGINE_CONFIG", str(config))
    monkeypatch.setenv("AGENTSERVE_ENGINE_MAX_NUM_SEQS", "5")
    settings = EngineSettings(max_num_batched_tokens=64)
    assert (settings.block_size, settings.max_num_seqs, settings.max_num_batched_tokens) == (8, 5, 64)


def test_shipped_yaml_loads_and_unknown_keys_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineSettings().block_size == 16
    config = tmp_path / "engine.yaml"
    config.write_text("blok_size: 8\n")
    monkeypatch.setenv("AGENTSERVE_ENGINE_CONFIG", str(config))
    with pytest.raises(ValidationError, match="blok_size"):
        EngineSettings()


def test_the_kv_pool_is_what_its_bytes_afford_beyond_what_running_requests_use() -> None:
    """The prefix cache and sessions' pinned KV hold blocks between turns, so max_num_seqs does not cap the pool."""
    config, _ = read_model_config("tiny")
    block_bytes = kv_bytes_per_block(config, 16, torch.float32)
    settings = EngineSettings(block_size=16, dtype="float32", max_num_seqs=1, kv_cache_bytes=1000 * block_bytes + 1)
    assert num_kv_blocks(config, settings) == 1000  # one full context of `tiny` is 128 blocks
    assert num_kv_blocks(config, settings.model_copy(update={"num_kv_blocks": 7})) == 7
