"""The coordinator's workers over their lives: started at once, a dead one started again under the same id
(up to `max_restarts`), and, where the launcher finds new nodes (Ray), a worker added per node. The list
index of a worker is its id, for good: a restarted worker takes its place, a new one goes at the end.

A worker added later must be able to ship KV to every other: each of them opens a receiver for it (`Listen`)
and answers with the address (`Listening`); it serves once every answer is in."""

from __future__ import annotations

import collections
import logging
import time

from engine.config import EngineSettings
from engine.workers import messages as m
from engine.workers.coordinator.handles import Launcher, WorkerHandle, advance_start, start_workers, stop_workers
from engine.workers.coordinator.launchers import make_launcher
from engine.workers.deployment import DeploymentSettings
from engine.workers.worker.process import WorkerSpec

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, model: str, settings: EngineSettings, deployment: DeploymentSettings) -> None:
        self.model, self.settings, self.deployment = model, settings, deployment
        self.launcher: Launcher = make_launcher(deployment)
        roles = [m.PREFILL] * deployment.prefill + [m.DECODE] * deployment.decode
        ids = range(len(roles))
        specs = [self._spec(i, role, tuple(peer for peer in ids if peer != i)) for i, role in enumerate(roles)]
        try:
            self.workers = start_workers(self.launcher, specs, deployment)
        except BaseException:
            self.launcher.close()
            raise
        self.restarts: collections.Counter[int] = collections.Counter()
        self.awaiting: dict[int, set[int]] = {}  # joined worker -> workers yet to open a receiver for it
        self.last_watch = time.monotonic()

    def _spec(self, worker_id: int, role: str, peers: tuple[int, ...], node: str = "") -> WorkerSpec:
        d = self.deployment
        return WorkerSpec(worker_id, self.model, self.settings, d.transport, role, d.threads_per_worker,
                          d.kv_timeout_s, d.kv_fault if role == m.PREFILL else None, peers=peers, node=node,
                          nice=d.worker_nice)

    def starting(self) -> list[WorkerHandle]:
        return [w for w in self.workers if w.starting]

    def restart(self, dead: WorkerHandle) -> bool:
        """Start a dead worker again in its role; False when it has used up its restarts."""
        if self.restarts[dead.worker_id] >= self.deployment.max_restarts:
            log.error("worker %d died %d times: not restarting it", dead.worker_id, self.restarts[dead.worker_id])
            return False
        self.restarts[dead.worker_id] += 1
        peers = tuple(w.worker_id for w in self.workers if w.worker_id != dead.worker_id)
        self.workers[dead.worker_id] = self.launcher.launch(self._spec(dead.worker_id, dead.role, peers))
        log.warning("restarting worker %d (restart %d)", dead.worker_id, self.restarts[dead.worker_id])
        return True

    def advance(self) -> list[WorkerHandle]:
        """Workers that finished starting since the last call (restarted ones; joined ones once every peer
        listens for them)."""
        ready = []
        for handle in self.starting():
            try:
                started = advance_start(self.launcher, handle, self.deployment,
                                        time.monotonic() - handle.started_at > self.deployment.ready_timeout_s)
            except RuntimeError as error:
                log.error("%s", error)
                handle.starting = handle.alive = False
                handle.process.kill()
                continue
            if not started:
                continue
            if self.awaiting.get(handle.worker_id):
                handle.alive = False  # serves once its peers listen for it
                continue
            self.awaiting.pop(handle.worker_id, None)
            ready.append(handle)
        return ready

    def watch_nodes(self, now: float) -> None:
        """Add a worker on each node the launcher newly finds (a Ray node that joined with a role resource)."""
        if now - self.last_watch < self.deployment.ray.watch_nodes_s:
            return
        self.last_watch = now
        occupied = {w.node for w in self.workers if w.alive or w.starting}
        for node, role in self.launcher.new_nodes(occupied):
            for _ in range(self.deployment.ray.workers_per_joined_node):
                self._join(node, role)

    def _join(self, node: str, role: str) -> None:
        worker_id = len(self.workers)
        peers = [w for w in self.workers if w.alive]
        self.workers.append(self.launcher.launch(self._spec(worker_id, role, tuple(w.worker_id for w in peers), node)))
        self.awaiting[worker_id] = set()
        for peer in peers:
            try:
                peer.send(m.Listen(worker_id))
                self.awaiting[worker_id].add(peer.worker_id)
            except OSError:
                continue  # it died: its death is noticed at the next liveness check
        log.info("node %s joined: worker %d starts there as %s", node, worker_id, role)

    def listening(self, event: m.Listening) -> WorkerHandle | None:
        """A peer opened a receiver for a joined worker; the joined worker, when that was the last one."""
        self.workers[event.worker_id].kv_addresses[event.peer_id] = event.address
        return self._peer_settled(event.peer_id, event.worker_id)

    def forget(self, dead_id: int) -> list[WorkerHandle]:
        """A dead worker will not answer: joined workers that waited only for it serve now."""
        return [w for joined in list(self.awaiting) if (w := self._peer_settled(joined, dead_id)) is not None]

    def _peer_settled(self, joined: int, peer_id: int) -> WorkerHandle | None:
        waiting = self.awaiting.get(joined)
        if waiting is None or peer_id not in waiting:
            return None
        waiting.discard(peer_id)
        handle = self.workers[joined]
        if waiting or handle.starting:
            return None
        del self.awaiting[joined]
        handle.alive = True
        return handle

    def stop(self, deadline_s: float) -> list[m.KVCounters]:
        try:
            return stop_workers(self.workers, deadline_s)
        finally:
            self.launcher.close()
