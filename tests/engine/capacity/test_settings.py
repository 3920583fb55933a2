from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, PREFILL
from engine.workers import messages


def test_shipped_yaml_matches_the_defaults() -> None:
    assert CapacitySettings() == CapacitySettings.model_construct()
    settings = CapacitySettings()
    assert (settings.interval_s, settings.hold_s, settings.min_per_role, settings.pinned_split) == (0.1, 2.0, 1, None)
    assert (settings.decode_over_prefill_latency, settings.kv_hit_ratio_min, settings.retransmit_ratio_max) == (
        3.0, 0.6, 0.001)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "capacity.yaml"
    config.write_text("hold_s: 5\npinned_split: [1, 3]\n")
    monkeypatch.setenv("AGENTSERVE_CAPACITY_CONFIG", str(config))
    monkeypatch.setenv("AGENTSERVE_CAPACITY_HOLD_S", "0.5")
    settings = CapacitySettings()
    assert settings.hold_s == 0.5 and settings.pinned_split == (1, 3)


@pytest.mark.parametrize("yaml_text, field", [("hold_stime: 1\n", "hold_stime"), ("pinned_split: [0, 0]\n", "pinned"),
                                              ("interval_s: 0\n", "interval_s")])
def test_bad_settings_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str, field: str) -> None:
    config = tmp_path / "capacity.yaml"
    config.write_text(yaml_text)
    monkeypatch.setenv("AGENTSERVE_CAPACITY_CONFIG", str(config))
    with pytest.raises(ValidationError, match=field):
        CapacitySettings()


def test_role_names_match_the_workers() -> None:
    assert (PREFILL, DECODE) == (messages.PREFILL, messages.DECODE)
