"""The serving process's handle on one worker, and its life: launched (by a `Launcher`: a local child process
or a Ray actor), connected, handshaken (Ready, clock offset), stopped."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from engine.core.stats import EngineStats
from engine.workers import messages as m
from engine.workers.coordinator.outbox import Outbox
from engine.workers.deployment import DeploymentSettings
from engine.workers.worker.process import WorkerSpec

log = logging.getLogger(__name__)
CLOCK_SAMPLES = 8


class WorkerProcess(Protocol):
    """Where a worker runs: `multiprocessing`'s process, or a Ray actor's run."""

    @property
    def pid(self) -> int | None: ...
    def is_alive(self) -> bool: ...
    def join(self, timeout: float | None = None) -> None: ...
    def kill(self) -> None: ...


@dataclass(eq=False)
class WorkerHandle:
    worker_id: int
    role: str
    process: WorkerProcess
    conn: Connection | None  # None: launched, not connected yet (a Ray actor dials in)
    kv_addresses: dict[int, str] = field(default_factory=dict)  # sending worker id -> address here
    clock_offset_s: float = 0.0  # worker clock minus ours
    alive: bool = True  # serving: connected, ready, not found dead
    starting: bool = False  # launched, Ready not in yet (alive turns True with it)
    started_at: float = 0.0  # monotonic time of the launch
    pid: int | None = None  # the worker's own, from its Ready
    node: str = ""  # where it runs: "local", or the Ray node id
    frozen_objects: int = 0  # its startup heap, frozen before its Ready (engine.gc_heap)
    pending_decode: dict[str, int] = field(default_factory=dict)  # attempt id -> decode worker, while prefilling
    stats: EngineStats = field(default_factory=EngineStats)  # its latest Load report
    report_due: bool = False  # it was given work since that report: another one is coming
    kv_tiers: dict[str, Any] | None = None  # the KV tier counters of its latest Load report; None: no tiers
    switched_at: float = 0.0  # monotonic time of its last role change (hysteresis)
    outbox: Outbox | None = None  # the sends to its conn, made at the first

    def send(self, command: m.Command) -> None:
        """Never blocks: what the pipe cannot take now is written by later `flush` calls, in order."""
        if self.conn is None:
            raise BrokenPipeError(f"worker {self.worker_id} is not connected")
        if self.outbox is None:
            self.outbox = Outbox(self.conn)
        self.outbox.send(command)

    def flush(self) -> None:
        """Write what its sends left queued, as far as the pipe takes it (raises OSError on a closed pipe)."""
        if self.outbox is not None:
            self.outbox.flush()

    def drop_outbox(self) -> None:
        """Its held-back commands given up (it died, or it is stopped)."""
        if self.outbox is not None:
            self.outbox.close()
            self.outbox = None

    @property
    def sending(self) -> bool:
        """Bytes of its commands wait for room in the pipe."""
        return self.outbox is not None and self.outbox.pending


class Launcher(Protocol):
    """Starts workers somewhere (on `spec.node` when set); `connection` is the worker's pipe once it has one
    (None: not yet); `new_nodes` are nodes fit for a role that host none of the `occupied` ones' workers."""

    def launch(self, spec: WorkerSpec) -> WorkerHandle: ...
    def connection(self, handle: WorkerHandle) -> Connection | None: ...
    def new_nodes(self, occupied: set[str]) -> list[tuple[str, str]]: ...  # (node, role)
    def close(self) -> None: ...


def start_workers(launcher: Launcher, specs: list[WorkerSpec], deployment: DeploymentSettings) -> list[WorkerHandle]:
    """Launch every worker at once, then wait until each has sent its Ready."""
    handles = [launcher.launch(spec) for spec in specs]
    try:
        deadline = time.monotonic() + deployment.ready_timeout_s
        while any(handle.starting for handle in handles):
            for handle in handles:
                advance_start(launcher, handle, deployment, time.monotonic() > deadline)
            time.sleep(0.01)
    except BaseException:
        stop_workers(handles, 5.0)
        raise
    return handles


def advance_start(launcher: Launcher, handle: WorkerHandle, deployment: DeploymentSettings,
                  overdue: bool) -> bool:
    """Take a starting worker's Ready if it is in (True: it now serves); raises when it failed to start."""
    if not handle.starting:
        return False
    handle.conn = handle.conn or launcher.connection(handle)
    if handle.conn is not None and handle.conn.poll(0):
        _handshake(handle, handle.conn, deployment)
        return True
    if not handle.process.is_alive():
        raise RuntimeError(f"worker {handle.worker_id} ended before it was ready")
    if overdue:
        raise RuntimeError(f"worker {handle.worker_id} sent no ready message in {deployment.ready_timeout_s} s")
    return False


def _handshake(handle: WorkerHandle, conn: Connection, deployment: DeploymentSettings) -> None:
    try:
        ready = conn.recv()
    except (EOFError, OSError) as error:
        raise RuntimeError(f"worker {handle.worker_id} closed its pipe before it was ready") from error
    if not isinstance(ready, m.Ready):
        raise RuntimeError(f"worker {handle.worker_id} started with {ready!r} instead of a ready message")
    handle.kv_addresses, handle.pid, handle.node = ready.kv_addresses, ready.pid, ready.node
    handle.frozen_objects = ready.frozen_objects
    handle.clock_offset_s = estimate_clock_offset(conn)
    handle.starting, handle.alive = False, True
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
        if handle.conn is None:  # launched, never connected: nothing to drain
            handle.process.kill()
        elif (handle.alive or handle.starting) and handle.process.is_alive():
            try:
                handle.send(m.Shutdown(deadline_s))
            except (BrokenPipeError, OSError):
                handle.alive = False
    deadline = time.monotonic() + deadline_s
    for handle in handles:
        _drain_outbox(handle, deadline)
        counters += _collect_stopped(handle, deadline)
        handle.process.join(max(0.0, deadline - time.monotonic()))
        if handle.process.is_alive():
            log.warning("worker %d did not stop in time; killing it", handle.worker_id)
            handle.process.kill()
            handle.process.join(5)
        handle.alive = handle.starting = False
    return counters


def _drain_outbox(handle: WorkerHandle, deadline: float) -> None:
    """Its last commands (the Shutdown) written before waiting for it to stop; then its outbox closed."""
    if handle.outbox is None:
        return
    with contextlib.suppress(OSError):  # its end is closed: it is gone already
        handle.outbox.drain(deadline)
    handle.drop_outbox()


def _collect_stopped(handle: WorkerHandle, deadline: float) -> list[m.KVCounters]:
    if handle.conn is None:
        return []
    try:
        while handle.conn.poll(max(0.0, deadline - time.monotonic())):
            event = handle.conn.recv()
            if isinstance(event, m.Stopped):
                return [event.counters]
    except (EOFError, OSError):
        pass
    return []
