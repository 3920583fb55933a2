"""The gateway's settings: `configs/gateway.yaml` (or `AGENTSERVE_GATEWAY_CONFIG`), overridden by
`AGENTSERVE_*` environment variables (`AGENTSERVE_REDIS_URL`, `AGENTSERVE_PORT`, ...)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from engine import YamlSettings
from gateway.upstream.settings import UpstreamPoolSettings, UpstreamSpec, parse_upstreams


class LimitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = 4 * 1024 * 1024
    max_ws_message_bytes: int = 4 * 1024 * 1024
    ws_max_connection_age_s: float = 3600.0
    ws_ping_interval_s: float = 20.0
    ttft_slo_s: float | None = None  # admission: queue, then refuse, when the queued prefill would exceed it;
    # None: derived, a full context's prefill at the measured rate (gateway.admission)
    tpot_slo_s: float | None = None  # admission: reject when the streams in flight would exceed it; None: no check
    initial_prefill_tokens_per_s: float = 2000.0
    max_sessions_per_key: int | None = Field(default=None, ge=1)  # sessions a key holds; None: no limit
    max_websockets_per_key: int | None = Field(default=None, ge=1)  # open WebSockets per key and replica


class GatewaySettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_GATEWAY_CONFIG"
    config_file: ClassVar[str] = "gateway.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_", env_nested_delimiter="__", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "smollm2"  # built-in model name, GGUF file or checkpoint directory
    disaggregated: bool = False  # prefill and decode workers (configs/deployment.yaml) instead of one engine
    engine_in_process: bool = False  # debugging: the colocated engine on a thread of the gateway, not a worker
    served_model_name: str | None = None  # the name clients use; defaults to the model's
    redis_url: str | None = None  # sessions (and rate limits) in Redis when set
    session_ttl_s: float = 3600.0
    auth_enabled: bool = False
    api_keys: list[dict[str, Any]] = Field(default_factory=list)  # see gateway.auth.ApiKeyRecord
    limits: LimitSettings = LimitSettings()
    drain_timeout_s: float = 30.0
    default_max_tokens: int | None = None  # reply cap without max_tokens; None: the rest of the context
    predictor_model: str | None = None  # next-turn load model; None: the shipped predictor/default_model.pt
    record_sessions: str | None = None  # a JSONL path: record per-turn session statistics (predictor training)
    log_content: bool = False  # log prompt and reply text (logger agentserve.content); off: no text reaches logs
    share_prefix_cache: bool = False  # reuse cached prefixes across API keys (one tenant); off: per key
    upstreams: list[UpstreamSpec] = Field(default_factory=list)  # serve through these instead of `model`'s engine
    upstream: UpstreamPoolSettings = UpstreamPoolSettings()

    @field_validator("upstreams", mode="before")
    @classmethod
    def _upstream_urls(cls, value: Any) -> Any:
        """Items may be plain base URLs (`http://host:port/v1`)."""
        return parse_upstreams(value) if isinstance(value, list) else value

    @property
    def model_name(self) -> str:
        return self.served_model_name or os.path.basename(self.model.rstrip("/"))
