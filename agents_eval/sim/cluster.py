"""Building a simulated cluster: workers with the engine's scheduler and block manager, their step timers,
and the links between them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import simpy

from agents_eval.sim.blocks import BlockHashes, SimKVCacheManager
from agents_eval.sim.calibration import CalibratedTimer, Calibration
from agents_eval.sim.config import ClusterConfig, Pool, transports
from agents_eval.sim.cost import Link, RooflineTimer, StepTimer
from agents_eval.sim.records import RunLog
from agents_eval.sim.specs import DeviceSpec, ModelShape
from agents_eval.sim.tokens import TokenIds
from agents_eval.sim.worker import Gpus, Host, SimWorker
from engine.capacity.signals import DECODE, PREFILL
from engine.core.queue_policy import make_queue_policy
from engine.core.scheduler import Scheduler
from engine.core.slo import load_slo_config


@dataclass
class Cluster:
    env: simpy.Environment
    config: ClusterConfig
    shape: ModelShape
    workers: list[SimWorker]
    links: dict[int, tuple[Link, simpy.Resource]]  # worker id -> its share of its node's link, one transfer at a time
    tokens: TokenIds
    log: RunLog
    dispatch_s: float = 0.0  # a request's trip to its worker process, paid before the worker has it

    def by_id(self, worker_id: int) -> SimWorker:
        return self.workers[worker_id]

    @property
    def gpus(self) -> int:
        return sum(w.gpus.count for w in self.workers)

    def price_per_hour(self) -> float:
        return sum(w.gpus.count * DeviceSpec.load(w.gpus.device).price_per_gpu_hour for w in self.workers)


def build_cluster(env: simpy.Environment, config: ClusterConfig) -> Cluster:
    shape = ModelShape.load(config.model, config.dtype)
    transport = transports()[config.transport]
    tokens, log, hashes = TokenIds(), RunLog(), BlockHashes()
    workers: list[SimWorker] = []
    links: dict[int, tuple[Link, simpy.Resource]] = {}
    # a calibration describes one host: its one timer for every pool, and the host all its workers share
    calibration = Calibration.load(Path(config.calibration)) if config.calibration is not None else None
    calibrated = (CalibratedTimer(calibration, config.worker_processes)
                  if calibration is not None else None)
    host = Host() if calibration is not None else None
    for pool in config.pools:
        device = DeviceSpec.load(pool.device)
        timer: StepTimer = calibrated or RooflineTimer(device, shape, pool.tensor_parallel)
        per_node = pool.gpus_per_node // pool.tensor_parallel
        for _ in range(pool.workers):
            worker_id = len(workers)
            role = PREFILL if pool.role == PREFILL else DECODE  # a colocated worker decodes and prefills locally
            scheduler = _scheduler(config, shape, device, pool, hashes)
            workers.append(SimWorker(env, worker_id, role, scheduler, timer, Gpus(pool.device, pool.tensor_parallel),
                                     tokens, log, host))
            link = Link(config.node_link_bandwidth / per_node, transport.efficiency, transport.latency_s)
            links[worker_id] = (link, simpy.Resource(env, capacity=1))
    # a request's trip to its worker process (and its first token's back)
    dispatch_s = calibration.worker_hop_s if calibration is not None and config.worker_processes else 0.0
    return Cluster(env, config, shape, workers, links, tokens, log, dispatch_s)


def kv_blocks(config: ClusterConfig, shape: ModelShape, device: DeviceSpec, pool: Pool) -> int:
    """Blocks the worker's GPUs hold after the weights, capped at the config's max_kv_blocks."""
    free = pool.tensor_parallel * device.memory_bytes * config.engine.kv_memory_share
    free -= shape.total_params * shape.dtype_bytes
    if free <= 0:
        raise ValueError(f"{config.model} does not fit {pool.tensor_parallel} x {device.name}")
    blocks = int(free // (config.engine.block_size * shape.kv_bytes_per_token))
    return max(1, min(blocks, config.engine.max_kv_blocks))


def _scheduler(config: ClusterConfig, shape: ModelShape, device: DeviceSpec, pool: Pool,
               hashes: BlockHashes) -> Scheduler:
    knobs = config.engine
    kv = SimKVCacheManager(kv_blocks(config, shape, device, pool), knobs.block_size, knobs.prefix_caching, hashes)
    return Scheduler(kv, knobs.max_num_batched_tokens, knobs.max_num_seqs,
                     policy=make_queue_policy(knobs.queue_policy, load_slo_config()))
