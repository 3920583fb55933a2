"""How many workers of each role, over which KV transport: `configs/deployment.yaml`, overridden by
`AGENTSERVE_DEPLOYMENT_*` environment variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from engine.config import YamlSettings


class DeploymentSettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_DEPLOYMENT_CONFIG"
    config_file: ClassVar[str] = "deployment.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_DEPLOYMENT_", extra="forbid")

    prefill: int = 1
    decode: int = 1
    transport: str = "shm"  # inproc | shm | tcp | rdma
    threads_per_worker: int = 1
    kv_timeout_s: float = 5.0  # a decode worker recomputes a request whose KV is not in by then
    ready_timeout_s: float = 180.0
    clock_offset_warn_s: float = 0.001
    kv_fault: str | None = None  # failure testing only: corrupt_payload | wrong_version | cut | drop
