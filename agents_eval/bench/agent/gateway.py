"""The gateways `agentserve bench --workload` compares, one process each: `python -m agentserve serve` on a
free loopback port with the configuration's environment, ready when `GET /ready` answers 200, stopped with
SIGTERM (the gateway drains, then exits). Also what the benchmark reads from a running gateway: its model
name, its /metrics counters, and its prefill/decode split (`GET /admin/capacity`, or the
`agentserve:num_workers{role=...}` gauge where that endpoint does not exist).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agents_eval.bench.agent.metrics import parse_metrics

if TYPE_CHECKING:
    from engine.workers.deployment import DeploymentSettings

READY_TIMEOUT_S = 300.0  # disaggregated workers load the model in their own processes
STOP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.25
ADMIN_KEY = secrets.token_urlsafe(24)  # this run's key for its gateways' /admin endpoints (auth stays off)
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def admin_key_env() -> dict[str, str]:
    """The gateway setting that makes ADMIN_KEY an admin key; with auth off, workload requests need no key."""
    digest = hashlib.sha256(ADMIN_KEY.encode()).hexdigest()
    return {"AGENTSERVE_API_KEYS": json.dumps([{"name": "bench-admin", "sha256": digest, "admin": True}])}


def colocated_threads(user_env: Mapping[str, str]) -> int:
    """The torch threads the disaggregated workers use in all (workers x threads each), for the colocated
    engine: the same cores either way."""
    return deployment_workers(user_env) * _deployment(user_env).worker_threads


def deployment_workers(user_env: Mapping[str, str]) -> int:
    """The disaggregated configurations' worker processes (prefill and decode)."""
    deployment = _deployment(user_env)
    return deployment.prefill + deployment.decode


def _deployment(user_env: Mapping[str, str]) -> DeploymentSettings:
    """configs/deployment.yaml with the user's overrides of the split and the threads."""
    from engine.workers.deployment import DeploymentSettings

    keys = {"prefill", "decode", "threads_per_worker"}
    prefix = "AGENTSERVE_DEPLOYMENT_"
    overrides: dict[str, Any] = {k.removeprefix(prefix).lower(): v for k, v in user_env.items() if k.startswith(prefix)}
    return DeploymentSettings(**{k: v for k, v in overrides.items() if k in keys})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # what this benchmark set, for the report

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def running_gateway(model: str, env: dict[str, str], log_path: Path) -> Iterator[GatewayProcess]:
    """A gateway process until the block exits; its output goes to `log_path`."""
    port = free_port()
    command = [sys.executable, "-m", "agentserve", "serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(port)]
    with running_process(command, port, env, log_path, "/ready", "the gateway", hidden_env=admin_key_env()) as gateway:
        yield gateway


@contextlib.contextmanager
def running_process(command: list[str], port: int, env: dict[str, str], log_path: Path, ready_path: str,
                   name: str, timeout_s: float = READY_TIMEOUT_S,
                   hidden_env: Mapping[str, str] | None = None) -> Iterator[GatewayProcess]:
    """A server process, ready once `GET ready_path` answers 200, until the block exits. `hidden_env` is set
    for the process but not kept in `GatewayProcess.env` (which reports print)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:  # its own process group: its worker processes stop with it
        process = subprocess.Popen(command, env={**os.environ, **env, **(hidden_env or {})}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = GatewayProcess(f"http://127.0.0.1:{port}", process, log_path, env)
    try:
        _wait_until_ready(server, ready_path, name, timeout_s)
        yield server
    finally:
        stop(server)


def _wait_until_ready(server: GatewayProcess, ready_path: str, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:  # one client: each of httpx.get's builds an SSL context (~10 ms)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"{name} exited with status {server.process.returncode} before it was "
                                   f"ready; its log ({server.log_path}) ends:\n{server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{server.url}{ready_path}").status_code == 200:
                    return
            time.sleep(0.1)
    raise RuntimeError(f"{name} at {server.url} was not ready within {timeout_s:.0f} s; its log "
                       f"({server.log_path}) ends:\n{server.log_tail()}")


def stop(gateway: GatewayProcess) -> None:
    """SIGTERM and wait for the drain; the process group is killed if it outlives `STOP_TIMEOUT_S`."""
    process = gateway.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


async def model_name(http: httpx.AsyncClient) -> str:
    response = (await http.get("/v1/models")).raise_for_status()
    return str(response.json()["data"][0]["id"])


async def scrape(http: httpx.AsyncClient) -> dict[str, Any]:
    """The gateway's counters and workers per role (`parse_metrics`)."""
    return parse_metrics((await http.get("/metrics")).raise_for_status().text)


async def capacity(http: httpx.AsyncClient) -> dict[str, Any]:
    """`{"split": {role: workers}, "events": [...], "source": ...}` from /admin/capacity, or from the
    num_workers gauge (no events) on a gateway without a capacity controller (404); any other answer raises."""
    response = await http.get("/admin/capacity", headers=ADMIN_HEADERS)
    if response.status_code != 404:
        response.raise_for_status()
        body = response.json()
        split = {role: int(count) for role, count in (body.get("split") or {}).items()}
        return {"split": split, "events": body.get("events", []), "enabled": body.get("enabled"),
                "source": "/admin/capacity"}
    return {"split": (await scrape(http))["workers"], "events": [], "enabled": None, "source": "/metrics"}


@dataclass
class RolePoller:
    """The split every `POLL_INTERVAL_S` while the run lasts: `[(seconds from start, {role: workers}), ...]`,
    a point only when the split changed (and the first one)."""

    http: httpx.AsyncClient
    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    errors: int = 0

    async def run(self) -> None:
        start = time.perf_counter()
        while True:
            try:
                split = (await capacity(self.http))["split"]
            except (httpx.HTTPError, ValueError, KeyError):
                self.errors += 1
            else:
                if not self.timeline or self.timeline[-1][1] != split:
                    self.timeline.append((time.perf_counter() - start, split))
            await asyncio.sleep(POLL_INTERVAL_S)
