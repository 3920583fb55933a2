"""What `agentserve bench --workload` reads from a running gateway beyond the harness's (`harness.servers`):
its prefill/decode split (`GET /admin/capacity`, or the `agentserve:num_workers{role=...}` gauge where that
endpoint does not exist), polled while a point runs; and the deployment's workers and threads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from agents_eval.harness.servers.gateway import ADMIN_HEADERS, scrape

if TYPE_CHECKING:
    from engine.workers.deployment import DeploymentSettings

POLL_INTERVAL_S = 0.25


def colocated_threads(user_env: Mapping[str, str]) -> int:
    """The torch threads the disaggregated workers use in all (workers x threads each), for the colocated
    engine: the same cores either way."""
    return deployment_workers(user_env) * _deployment(user_env).worker_threads


def threads_per_worker(user_env: Mapping[str, str]) -> int:
    return _deployment(user_env).worker_threads


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
