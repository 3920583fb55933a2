"""The trajectory package's settings: `configs/trajectory.yaml`, overridden by `AGENTSERVE_TRAJECTORY_*`.
Pruning rules and the phase classifier keep their own files (`configs/pruning.yaml`, `configs/phase.yaml`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from engine import YamlSettings


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


class HistorySettings(BaseModel):
    """Which history a turn's attention reads. `age`: the masks above (observations older than the last K
    skipped). `query`: the engine scores every history block against the decode step's queries (per-block key
    bounds) every `refresh_steps` steps and reads the best `budget` share of the history, never skipping the
    sinks, the tool-call headers (assistant turns and the first `header_tokens` of each observation), the
    current and previous turn, and the last `recent_tokens`. `attention`: as `query`, the blocks scored by the
    attention the decode queries actually gave them, accumulated over the reply. A request picks one of `policies` with
    `metadata.history_policy`; `default` when it does not."""

    model_config = ConfigDict(extra="forbid")

    policies: list[Literal["age", "query", "attention"]] = ["age", "query", "attention"]  # what is offered here
    default: Literal["age", "query", "attention"] = "age"
    budget: float = Field(default=0.5, gt=0, le=1)  # share of the history's blocks a decode step reads
    refresh_steps: int = Field(default=16, ge=1)
    recent_tokens: int = Field(default=256, ge=0)
    header_tokens: int = Field(default=16, ge=0)

    @model_validator(mode="after")
    def _default_offered(self) -> HistorySettings:
        if self.default not in self.policies:
            raise ValueError(f"history.default {self.default!r} is not among history.policies {self.policies}")
        return self


class TrajectorySettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_TRAJECTORY_CONFIG"
    config_file: ClassVar[str] = "trajectory.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_TRAJECTORY_", env_nested_delimiter="__",
                                      extra="forbid")

    ttl: TTLSettings = TTLSettings()
    masks: MaskSettings = MaskSettings()
    history: HistorySettings = HistorySettings()
    prune: bool = True
