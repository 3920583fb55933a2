"""The trajectory package's settings: `configs/trajectory.yaml`, overridden by `AGENTSERVE_TRAJECTORY_*`.
Pruning rules and the phase classifier keep their own files (`configs/pruning.yaml`, `configs/phase.yaml`)."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from engine.config import CONFIGS_DIR


class TTLSettings(BaseModel):
    """How long a session's KV stays pinned after a turn (seconds)."""

    model_config = ConfigDict(extra="forbid")

    default_s: float = 5.0  # no gap observed yet for the tools called
    floor_s: float = 0.5
    cap_s: float = 60.0
    margin: float = 1.5  # pin for margin x the expected gap
    ema_alpha: float = 0.3  # weight of the newest observed gap


class MaskSettings(BaseModel):
    """Sparse history masks: older tool observations are skipped by attention."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    keep_last_tool_observations: int = 2
    sink_tokens: int = 4  # the first tokens are never masked (attention sinks)


class TrajectorySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_TRAJECTORY_", env_nested_delimiter="__",
                                      extra="forbid")

    ttl: TTLSettings = TTLSettings()
    masks: MaskSettings = MaskSettings()
    prune: bool = True

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("AGENTSERVE_TRAJECTORY_CONFIG", str(CONFIGS_DIR / "trajectory.yaml"))
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file)
