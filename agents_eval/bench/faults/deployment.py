"""What the campaign runs and breaks: a redis-server with an append-only file (fsync on every write, so a
restarted one has every session), replica 0 (disaggregated: prefill and decode worker processes) and
replica 1 (colocated), both on that Redis; the faults are SIGKILL of a worker of a role, SIGKILL and restart
of Redis, SIGTERM of replica 1 (it drains and exits; replica 0 continues its sessions)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agents_eval.harness.servers.gateway import ADMIN_HEADERS, running_gateway
from agents_eval.harness.servers.process import ServerProcess
from agents_eval.harness.servers.redis import RedisServer, running_redis


@dataclass
class Deployment:
    redis: RedisServer
    replicas: list[ServerProcess]
    workers: list[dict[str, Any]]  # replica 0's, as /admin/capacity listed them before the load (roles stay)
    stopped: set[int] = field(default_factory=set)  # replicas the campaign SIGTERMed
    killed: set[int] = field(default_factory=set)  # worker pids the campaign SIGKILLed

    def alive(self, replica: int) -> bool:
        return replica not in self.stopped

    def kill_worker(self, role: str) -> str:
        """SIGKILL one worker of `role` on replica 0; what was done, for the timeline."""
        worker = next(w for w in self.workers if w["role"] == role and w["pid"] not in self.killed)
        self.killed.add(worker["pid"])
        os.kill(int(worker["pid"]), signal.SIGKILL)
        return f"killed {role} worker {worker['worker_id']} (pid {worker['pid']})"

    def stop_replica(self, replica: int) -> str:
        self.stopped.add(replica)
        self.replicas[replica].process.send_signal(signal.SIGTERM)
        return f"SIGTERM replica {replica}"


@contextlib.contextmanager
def deployed(model: str, workers: int, out: Path) -> Iterator[Deployment]:
    """Redis and the two replicas, stopped when the block exits."""
    with running_redis(out / "redis", persistent=True) as redis:
        common = {"AGENTSERVE_REDIS_URL": redis.url, "AGENTSERVE_DRAIN_TIMEOUT_S": "30"}
        disaggregated = {**common, "AGENTSERVE_DISAGGREGATED": "true", "AGENTSERVE_DEPLOYMENT_PREFILL": str(workers),
                         "AGENTSERVE_DEPLOYMENT_DECODE": str(workers), "AGENTSERVE_CAPACITY_ENABLED": "false"}
        with running_gateway(model, disaggregated, out / "replica-0.log") as first, \
                running_gateway(model, common, out / "replica-1.log") as second:
            report = httpx.get(f"{first.url}/admin/capacity", headers=ADMIN_HEADERS, timeout=60).raise_for_status()
            yield Deployment(redis, [first, second], report.json()["workers"])
