"""Starting, handshaking with and stopping worker processes."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from engine.config import EngineSettings
from engine.stats import EngineStats
from engine.worker import messages as m
from engine.worker.deployment import DeploymentSettings
from engine.worker.worker import WorkerSpec, run_worker

log = logging.getLogger(__name__)
CLOCK_SAMPLES = 8


@dataclass(eq=False)
class WorkerHandle:
    worker_id: int
    role: str
    process: SpawnProcess
    conn: Connection
    kv_addresses: dict[int, str] = field(default_factory=dict)  # sending worker id -> address here
    clock_offset_s: float = 0.0  # worker clock minus ours
    alive: bool = True
    pending_decode: dict[str, int] = field(default_factory=dict)  # attempt id -> decode worker, while prefilling
    stats: EngineStats = field(default_factory=EngineStats)  # its latest Load report
    kv_tiers: dict[str, Any] | None = None  # the KV tier counters of its latest Load report; None: no tiers
    switched_at: float = 0.0  # monotonic time of its last role change (hysteresis)

    def send(self, command: m.Command) -> None:
        self.conn.send(command)


def start_workers(context: SpawnContext, model: str, settings: EngineSettings,
                  deployment: DeploymentSettings) -> list[WorkerHandle]:
    roles = [m.PREFILL] * deployment.prefill + [m.DECODE] * deployment.decode
    handles = [_spawn(context, index, role, model, settings, deployment, len(roles))
               for index, role in enumerate(roles)]
    try:
        for handle in handles:
            _handshake(handle, deployment)
    except BaseException:
        stop_workers(handles, 5.0)
        raise
    return handles


def _spawn(context: SpawnContext, index: int, role: str, model: str, settings: EngineSettings,
           deployment: DeploymentSettings, num_workers: int) -> WorkerHandle:
    ours, theirs = context.Pipe()
    spec = WorkerSpec(index, model, settings, deployment.transport, role, deployment.threads_per_worker,
                      deployment.kv_timeout_s, deployment.kv_fault if role == m.PREFILL else None,
                      peers=tuple(peer for peer in range(num_workers) if peer != index))
    process = context.Process(target=run_worker, args=(spec, theirs), name=f"agentserve-worker-{index}",
                              daemon=True)
    process.start()
    theirs.close()
    return WorkerHandle(index, role, process, ours)


def _handshake(handle: WorkerHandle, deployment: DeploymentSettings) -> None:
    if not handle.conn.poll(deployment.ready_timeout_s):
        raise RuntimeError(f"worker {handle.worker_id} sent no ready message in {deployment.ready_timeout_s} s")
    ready = handle.conn.recv()
    if not isinstance(ready, m.Ready):
        raise RuntimeError(f"worker {handle.worker_id} started with {ready!r} instead of a ready message")
    handle.kv_addresses = ready.kv_addresses
    handle.clock_offset_s = estimate_clock_offset(handle.conn)
    if abs(handle.clock_offset_s) > deployment.clock_offset_warn_s:
        log.warning("worker %d clock is %.3f ms off this process's", handle.worker_id, handle.clock_offset_s * 1e3)


def estimate_clock_offset(conn: Connection) -> float:
    """NTP-style: the worker's time minus the midpoint of each round trip, median of a few pings."""
    offsets = []
    for _ in range(CLOCK_SAMPLES):
        sent = time.time()
        conn.send(m.Ping(sent))
        pong = conn.recv()
        received = time.time()
        if isinstance(pong, m.Pong):
            offsets.append(pong.worker_time - (sent + received) / 2)
    return statistics.median(offsets) if offsets else 0.0


def stop_workers(handles: list[WorkerHandle], deadline_s: float) -> list[m.KVCounters]:
    """Ask every worker to stop after its current step; kill what is still running at the deadline."""
    counters = []
    for handle in handles:
        if handle.alive and handle.process.is_alive():
            try:
                handle.send(m.Shutdown(deadline_s))
            except (BrokenPipeError, OSError):
                handle.alive = False
    deadline = time.monotonic() + deadline_s
    for handle in handles:
        counters += _collect_stopped(handle, deadline)
        handle.process.join(max(0.0, deadline - time.monotonic()))
        if handle.process.is_alive():
            log.warning("worker %d did not stop in time; killing it", handle.worker_id)
            handle.process.kill()
            handle.process.join(5)
        handle.alive = False
    return counters


def _collect_stopped(handle: WorkerHandle, deadline: float) -> list[m.KVCounters]:
    try:
        while handle.conn.poll(max(0.0, deadline - time.monotonic())):
            event = handle.conn.recv()
            if isinstance(event, m.Stopped):
                return [event.counters]
    except (EOFError, OSError):
        pass
    return []
