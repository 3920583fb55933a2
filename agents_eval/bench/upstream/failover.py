"""The failover figure: a front gateway over the replicas and one dead address (nothing listens there; a
killed replica looks the same), which stays in the pool until a request finds it gone. The sessions hashed
to it retry their first turn on a live replica; their TTFT against the other sessions' is the cost."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from agents_eval.bench.agent.gateway import free_port, running_gateway
from agents_eval.bench.upstream.drive import TurnResult, all_sessions
from agents_eval.bench.upstream.workload import UpstreamBenchSettings
from gateway.auth import ANONYMOUS
from gateway.sessions.store import session_key
from gateway.upstream.hashing import BoundedLoadRing
from gateway.upstream.settings import UpstreamPoolSettings

ROUTING = "failover"


def session_ids(dead: str, names: list[str], sessions: int) -> list[str]:
    """Session ids, the first half (rounded up) of them hashed to the dead address, the rest elsewhere."""
    pool = UpstreamPoolSettings()
    ring = BoundedLoadRing(names, pool.virtual_nodes, pool.load_factor)
    homed: dict[bool, list[str]] = {True: [], False: []}
    wanted = {True: (sessions + 1) // 2, False: sessions // 2}
    for k in itertools.count():
        session_id = f"{ROUTING}-{k}"
        on_dead = ring.walk(session_key(ANONYMOUS, session_id).path)[0] == dead
        if len(homed[on_dead]) < wanted[on_dead]:
            homed[on_dead].append(session_id)
        if all(len(homed[side]) == wanted[side] for side in homed):
            return homed[True] + homed[False]
    raise AssertionError("unreachable")


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def run_failover(settings: UpstreamBenchSettings, upstreams: list[str], log_dir: Path) -> dict[str, Any]:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    names = [f"{url}/v1" for url in upstreams] + [dead]
    env = {"AGENTSERVE_UPSTREAMS": json.dumps(names), "AGENTSERVE_UPSTREAM__HEALTH_INTERVAL_S": "3600"}
    with running_gateway(settings.model, env, log_dir / "front-failover.log") as front:
        results = asyncio.run(all_sessions(front.url, settings, ROUTING, session_ids(dead, names, settings.sessions)))
        metrics = httpx.get(front.url + "/metrics").text
    moved = set(range((settings.sessions + 1) // 2))  # indexes of the sessions hashed to the dead address
    first: dict[bool, list[TurnResult]] = {True: [], False: []}
    for result in results:
        if result.turn == 0:
            first[result.session in moved].append(result)
    match = re.search(r"^agentserve:upstream_failovers_total ([0-9.]+)$", metrics, re.MULTILINE)
    return {"sessions_moved": len(moved), "failovers": float(match.group(1)) if match else 0.0,
            "turns_answered": len(results),  # all_sessions raises on any error
            "first_turn_ttft_median_s": {"failed_over": _median([r.ttft_s for r in first[True]]),
                                         "direct": _median([r.ttft_s for r in first[False]])}}
