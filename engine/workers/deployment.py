"""How many workers of each role, over which KV transport: `configs/deployment.yaml`, overridden by
`AGENTSERVE_DEPLOYMENT_*` environment variables."""

from __future__ import annotations

import os
from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from engine.config import YamlSettings


class RaySettings(BaseModel):
    """Placement on a Ray cluster: the seed's prefill nodes and decode nodes are Ray nodes started with a
    custom resource naming their role (`ray start --resources='{"agentserve_prefill": 1}'`)."""

    model_config = ConfigDict(extra="forbid")

    address: str = "auto"  # the cluster to join (ray.init's address); "auto": the one this machine belongs to
    role_resources: dict[str, str] = Field(default_factory=lambda: {"prefill": "agentserve_prefill",
                                                                    "decode": "agentserve_decode"})
    accelerator_types: dict[str, str] = Field(default_factory=dict)  # role -> GPU type (Ray's, e.g. H100)
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    coordinator_host: str | None = None  # where workers dial the coordinator; None: this node's IP as Ray sees it
    watch_nodes_s: float = Field(default=2.0, gt=0)  # how often nodes that joined are looked for
    workers_per_joined_node: int = Field(default=1, ge=1)  # started on each node that joins with a role resource


class DeploymentSettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_DEPLOYMENT_CONFIG"
    config_file: ClassVar[str] = "deployment.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_DEPLOYMENT_", extra="forbid")

    prefill: int = 1
    decode: int = 1
    transport: str = "shm"  # inproc | shm | tcp | rdma
    threads_per_worker: int | None = 1  # None: torch's default (every core)
    # added to each worker process's niceness: where the gateway shares cores with its workers, its event loop and
    # the coordinator (short work on every request's path) run before the workers' model steps
    worker_nice: int = Field(default=5, ge=0, le=19)
    kv_timeout_s: float = 5.0  # a decode worker recomputes a request whose KV is not in by then
    ready_timeout_s: float = 180.0
    clock_offset_warn_s: float = 0.001
    kv_fault: str | None = None  # failure testing only: corrupt_payload | wrong_version | cut | drop
    max_restarts: int = Field(default=3, ge=0)  # a dead worker is started again this often, then left dead
    placement: Literal["local", "ray"] = "local"  # child processes here, or Ray actors across a Ray cluster
    ray: RaySettings = Field(default_factory=RaySettings)

    @model_validator(mode="after")
    def _kv_crosses_nodes(self) -> Self:
        if self.placement == "ray" and self.transport in ("inproc", "shm"):
            raise ValueError(f"placement ray puts workers on several nodes: transport {self.transport!r} cannot "
                             "reach across them (tcp or rdma)")
        return self

    @property
    def worker_threads(self) -> int:
        """Cores one worker computes on: its threads, or every core when torch picks."""
        return self.threads_per_worker or os.cpu_count() or 1

    @classmethod
    def colocated(cls, threads: int | None = None) -> DeploymentSettings:
        """One worker that prefills and decodes every request: the colocated engine, as its own process."""
        return cls(prefill=0, decode=1, transport="inproc", threads_per_worker=threads, placement="local")

