"""The trajectory package's settings: `configs/trajectory.yaml`, overridden by `AGENTSERVE_TRAJECTORY_*`.
Pruning rules and the phase classifier keep their own files (`configs/pruning.yaml`, `configs/phase.yaml`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic_settings import SettingsConfigDict

from engine.config import YamlSettings


class TTLSettings(BaseModel):
    """How long a session's KV stays pinned after a turn (seconds)."""

    model_config = ConfigDict(extra="forbid")

    default_s: float = 5.0  # no gap observed yet for the tools called
    floor_s: float = 0.5
    cap_s: float = 60.0
    margin: float = 1.5  # pin for margin x the expected gap
    ema_alpha: float = 0.3  # weight of the newest observed gap


class MaskSettings(BaseModel):
    """Sparse history masks: observations older than the last K (tool messages, function call outputs and,
    under `observation_users` in configs/pruning.yaml, user messages) are skipped by attention."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    keep_last_tool_observations: int = 2  # observations of any kind, the name kept for configs
    sink_tokens: int = 4  # the first tokens are never masked (attention sinks)


class TrajectorySettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_TRAJECTORY_CONFIG"
    config_file: ClassVar[str] = "trajectory.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_TRAJECTORY_", env_nested_delimiter="__",
                                      extra="forbid")

    ttl: TTLSettings = TTLSettings()
    masks: MaskSettings = MaskSettings()
    prune: bool = True
