from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import EngineSettings


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
