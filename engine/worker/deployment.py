"""How many workers of each role, over which KV transport: `configs/deployment.yaml`, overridden by
`AGENTSERVE_DEPLOYMENT_*` environment variables."""

from __future__ import annotations

import os

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from engine.config import CONFIGS_DIR


class DeploymentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_DEPLOYMENT_", extra="forbid")

    prefill: int = 1
    decode: int = 1
    transport: str = "shm"  # inproc | shm | tcp | rdma
    threads_per_worker: int = 1
    kv_timeout_s: float = 5.0  # a decode worker recomputes a request whose KV is not in by then
    ready_timeout_s: float = 180.0
    clock_offset_warn_s: float = 0.001
    kv_fault: str | None = None  # failure testing only: corrupt_payload | wrong_version | cut | drop

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("AGENTSERVE_DEPLOYMENT_CONFIG", str(CONFIGS_DIR / "deployment.yaml"))
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file)
