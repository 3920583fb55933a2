"""Workers as Ray actors (`deployment.placement: ray`). Each actor runs one worker loop and dials the
coordinator back over TCP (`multiprocessing.connection`, authenticated with a per-engine key): the same
typed messages as a local worker's pipe, so the coordinator does not know the difference. KV goes straight
from node to node over the KV transport (tcp or rdma), each worker listening on its node's address.

Nodes are picked by role: a node started with the custom resource of a role (`ray start
--resources='{"agentserve_decode": 1}'`, names in `configs/deployment.yaml`) takes that role's workers;
where no node has it, a worker goes wherever Ray has room. A node that joins later with a role resource
is reported by `new_nodes`, and the pool starts a worker on it."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle
from engine.workers.deployment import DeploymentSettings
from engine.workers.worker.process import WorkerSpec, run_worker

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 10.0
RESOURCE_SHARE = 0.001  # of a role resource per worker: the resource marks a node, it does not count workers


class WorkerActor:
    def run(self, spec: WorkerSpec, address: tuple[str, int], authkey: bytes) -> None:
        conn = Client(address, authkey=authkey)
        conn.send(m.Hello(spec.worker_id))
        spec = replace(spec, node=ray.get_runtime_context().get_node_id(), kv_host=ray.util.get_node_ip_address())
        run_worker(spec, conn)
        ray.actor.exit_actor()  # the actor exists for this one loop: give its resources back


class ActorProcess:
    """A worker actor's run, seen as a process: alive until the run returns or fails (its node lost)."""

    pid = None

    def __init__(self, actor: Any, run: ray.ObjectRef) -> None:
        self.actor, self.run = actor, run

    def is_alive(self) -> bool:
        done, _ = ray.wait([self.run], timeout=0)
        return not done

    def join(self, timeout: float | None = None) -> None:
        ray.wait([self.run], timeout=timeout)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


class RayLauncher:
    def __init__(self, deployment: DeploymentSettings) -> None:
        self.settings = deployment.ray
        if not ray.is_initialized():
            ray.init(address=self.settings.address, ignore_reinit_error=True)
        self.actor_class = ray.remote(WorkerActor)
        self.authkey = secrets.token_bytes(32)
        host = self.settings.coordinator_host or ray.util.get_node_ip_address()
        self.listener = Listener((host, 0), authkey=self.authkey)
        self.dialed: dict[int, Connection] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.known_nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        self.accepting = threading.Thread(target=self._accept, name="agentserve-ray-accept", daemon=True)
        self.accepting.start()

    def launch(self, spec: WorkerSpec) -> WorkerHandle:
        with self.lock:
            self.dialed.pop(spec.worker_id, None)
        actor = self.actor_class.options(**self._options(spec)).remote()
        run = actor.run.remote(spec, self.listener.address, self.authkey)  # type: ignore[attr-defined]
        return WorkerHandle(spec.worker_id, spec.role, ActorProcess(actor, run), None, alive=False, starting=True,
                            started_at=time.monotonic(), node=spec.node)

    def _options(self, spec: WorkerSpec) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.settings.cpus_per_worker, "num_gpus": self.settings.gpus_per_worker,
                                   "max_restarts": 0}
        resource = self.settings.role_resources.get(spec.role)
        if resource and resource in ray.cluster_resources():
            options["resources"] = {resource: RESOURCE_SHARE}
        if accelerator := self.settings.accelerator_types.get(spec.role):
            options["accelerator_type"] = accelerator
        if spec.node:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(spec.node, soft=False)
        return options

    def connection(self, handle: WorkerHandle) -> Connection | None:
        with self.lock:
            return self.dialed.pop(handle.worker_id, None)

    def new_nodes(self, occupied: set[str]) -> list[tuple[str, str]]:
        """Nodes that joined since the last look with a role resource, and host no worker yet."""
        found = []
        for node in ray.nodes():
            node_id = node["NodeID"]
            if not node["Alive"] or node_id in self.known_nodes:
                continue
            self.known_nodes.add(node_id)
            role = next((role for role, resource in self.settings.role_resources.items()
                         if resource in node["Resources"]), None)
            if role is not None and node_id not in occupied:
                found.append((node_id, role))
        return found

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError) as error:  # a bad key or a dropped dial: wait for the next
                log.warning("a worker's dial-in failed: %s", error)
                continue
            if self.closed:
                conn.close()
                return
            if not conn.poll(HELLO_TIMEOUT_S):
                conn.close()
                continue
            hello = conn.recv()
            with self.lock:
                self.dialed[hello.worker_id] = conn

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):  # wake the accepting thread
            Client(self.listener.address, authkey=self.authkey).close()
        self.accepting.join(5)
        self.listener.close()
