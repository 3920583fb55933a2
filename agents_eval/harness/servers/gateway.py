"""The gateway as a subprocess: `python -m agentserve serve` on a free loopback port with the caller's
environment, ready when `GET /ready` answers 200; and what a benchmark reads from a running gateway: its
model name and its /metrics counters. This run's admin key is set for the process (auth stays off)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import secrets
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agents_eval.harness.servers.process import ServerProcess, free_port, running_process

COUNTERS = ("prompt_tokens", "cached_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits",
            "pruned_tokens", "masked_tokens")
ADMIN_KEY = secrets.token_urlsafe(24)  # this run's key for its gateways' /admin endpoints (auth stays off)
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def admin_key_env() -> dict[str, str]:
    """The gateway setting that makes ADMIN_KEY an admin key; with auth off, workload requests need no key."""
    digest = hashlib.sha256(ADMIN_KEY.encode()).hexdigest()
    return {"AGENTSERVE_API_KEYS": json.dumps([{"name": "bench-admin", "sha256": digest, "admin": True}])}


@contextlib.contextmanager
def running_gateway(model: str, env: dict[str, str], log_path: Path) -> Iterator[ServerProcess]:
    """A gateway process until the block exits; its output goes to `log_path`."""
    port = free_port()
    command = [sys.executable, "-m", "agentserve", "serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(port)]
    with running_process(command, port, env, log_path, "/ready", "the gateway", hidden_env=admin_key_env()) as gateway:
        yield gateway


def env_item(text: str) -> tuple[str, str]:
    """A command line's `--env AGENTSERVE_KEY=VALUE`: one setting for every gateway a benchmark starts."""
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("AGENTSERVE_"):
        raise argparse.ArgumentTypeError(f"--env takes AGENTSERVE_KEY=VALUE, got {text!r}")
    return key, value


async def model_name(http: httpx.AsyncClient) -> str:
    response = (await http.get("/v1/models")).raise_for_status()
    return str(response.json()["data"][0]["id"])


async def scrape(http: httpx.AsyncClient) -> dict[str, Any]:
    """The gateway's counters and workers per role (`parse_metrics`)."""
    return parse_metrics((await http.get("/metrics")).raise_for_status().text)


def parse_metrics(text: str) -> dict[str, Any]:
    """The counters this benchmark reads (summed over labels, by short name) and the workers per role."""
    counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
    workers: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("agentserve:")
            if name.endswith("_total") and name.removesuffix("_total") in counters:
                counters[name.removesuffix("_total")] += sample.value
            elif name == "num_workers" and sample.value > 0:
                workers[sample.labels.get("role", "worker")] = int(sample.value)
    return {"counters": counters, "workers": workers}


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}
