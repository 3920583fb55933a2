"""The capacity controller's knobs: `configs/capacity.yaml`, overridden by `AGENTSERVE_CAPACITY_*`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from engine.config import YamlSettings

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Share = Annotated[float, Field(ge=0, le=1)]


class CapacitySettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_CAPACITY_CONFIG"
    config_file: ClassVar[str] = "capacity.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_CAPACITY_", extra="forbid")

    enabled: bool = True
    interval_s: Positive = 0.1
    hold_s: NonNegative = 2.0
    min_per_role: Annotated[int, Field(ge=0)] = 1
    demand_margin: NonNegative = 0.25
    pinned_split: tuple[int, int] | None = None  # (prefill, decode)

    target_tpot_s: Positive = 0.05
    prefill_drain_s: Positive = 0.5
    demand_smoothing_s: NonNegative = 2.0
    kv_target_usage: Annotated[float, Field(gt=0, le=1)] = 0.9
    forecast_horizon_s: Positive = 1.0
    prefill_tokens_per_s: Positive = 10000.0
    decode_s_per_token: Positive = 0.005

    local_prefill_max_tokens: Annotated[int, Field(ge=0)] = 256
    local_prefill_max_uncached_share: Share = 0.1
    local_prefill_max_stall_s: NonNegative = 0.05
    remote_prefill_max_queue_s: NonNegative = 0.5
    overlap_weight: NonNegative = 1.0

    decode_over_prefill_latency: Positive = 3.0
    kv_hit_ratio_min: Share = 0.6
    kv_hit_min_queries: Annotated[int, Field(ge=1)] = 1000
    retransmit_ratio_max: Share = 0.001
    retransmit_min_segments: Annotated[int, Field(ge=1)] = 1000
    snmp_path: Path = Path("/proc/net/snmp")

    event_log_size: Annotated[int, Field(ge=1)] = 256

    @field_validator("pinned_split")
    @classmethod
    def _check_split(cls, split: tuple[int, int] | None) -> tuple[int, int] | None:
        if split is not None:
            check_split(*split)
        return split


def check_split(prefill: int, decode: int) -> None:
    if prefill < 0 or decode < 0 or prefill + decode == 0:
        raise ValueError(f"a pinned split needs non-negative counts and at least one worker, got "
                         f"{prefill} prefill / {decode} decode")
