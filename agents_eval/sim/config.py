"""A simulated deployment: `configs/sim.yaml` names them (`clusters:`), with the link transports."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from engine.config import CONFIGS_DIR
from engine.core.slo import SloClass

SIM_CONFIG = CONFIGS_DIR / "sim.yaml"
Role = Literal["prefill", "decode", "colocated"]


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Pool(Strict):
    device: str  # configs/devices/<device>.yaml
    nodes: int = Field(ge=0)
    gpus_per_node: int = Field(8, ge=1)
    tensor_parallel: int = Field(8, ge=1)  # GPUs per worker; a node runs gpus_per_node // tensor_parallel
    role: Role

    @property
    def workers(self) -> int:
        return self.nodes * (self.gpus_per_node // self.tensor_parallel)

    @property
    def gpus(self) -> int:
        return self.workers * self.tensor_parallel


class EngineKnobs(Strict):
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    kv_memory_share: float = 0.9  # of the GPUs' memory, weights taken off the top
    max_kv_blocks: int = 65536  # bounds the simulator's memory; reported when it binds
    prefix_caching: bool = True
    queue_policy: Literal["fcfs", "slo"] = "fcfs"


class Transport(Strict):
    efficiency: float = Field(gt=0, le=1)  # share of the link's bandwidth a transfer gets
    latency_s: float = Field(ge=0)


class ClusterConfig(Strict):
    name: str
    model: str  # configs/models/<model>.yaml or any name engine.model.loader resolves
    dtype: str = "bfloat16"
    pools: tuple[Pool, ...]
    engine: EngineKnobs = EngineKnobs()
    transport: str = "rdma"
    node_link_bandwidth: float = 100.0e9  # bytes/s per node (800 Gbps InfiniBand), shared by its workers
    capacity: dict[str, Any] = Field(default_factory=dict)  # CapacitySettings overrides (routing, controller)
    controller: bool = False  # run the capacity controller (moves workers between prefill and decode)
    session_ttl_s: float | None = None  # pin a session's KV over the tool gap; None: no pins
    predictor: bool = False  # feed the controller the predictor's forecast
    calibration: str | None = None  # a calibration file: fitted step times instead of the roofline
    # the calibrated engine runs as worker processes: a request pays the calibration's worker_hop_s before its
    # worker has it, and an idle worker its worker_idle_penalty (False: the in-process engine's figures)
    worker_processes: bool = False
    slo_class: str = "interactive"  # configs/slo.yaml class whose TTFT and TPOT the run is judged by
    slo: SloClass | None = None  # targets to judge by instead of the class's (a paper's own SLOs)


def load_sim_config(path: Path = SIM_CONFIG) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping")
    return data


def cluster_config(name: str, path: Path = SIM_CONFIG, **overrides: Any) -> ClusterConfig:
    clusters = load_sim_config(path)["clusters"]
    if name not in clusters:
        raise ValueError(f"unknown cluster {name!r} in {path}; one of {', '.join(clusters)}")
    return ClusterConfig(name=name, **{**clusters[name], **overrides})


def transports(path: Path = SIM_CONFIG) -> dict[str, Transport]:
    return {name: Transport(**spec) for name, spec in load_sim_config(path)["transports"].items()}
