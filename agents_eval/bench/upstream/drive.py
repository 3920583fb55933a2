"""One routing run: a front gateway (`agentserve serve` with `AGENTSERVE_UPSTREAMS`) over the replicas, every
session's turns sent in order through the harness's chat client, the sessions concurrently; per turn the prompt
tokens the replica had to prefill (its prompt less its reported cached tokens) and the time to first token."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from agents_eval.bench.upstream.workload import UpstreamBenchSettings, session_turns
from agents_eval.harness.client import HttpPool
from agents_eval.harness.drive import RunLimits, chat_opener, drive
from agents_eval.harness.servers.gateway import running_gateway
from agents_eval.workloads.types import APPEND, THINK, SessionScript, Turn, Workload

REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TurnResult:
    session: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def front_env(upstreams: list[str], routing: str) -> dict[str, str]:
    return {"AGENTSERVE_UPSTREAMS": json.dumps([f"{url}/v1" for url in upstreams]),
            "AGENTSERVE_UPSTREAM__ROUTING": routing}


def routing_workload(settings: UpstreamBenchSettings, routing: str, session_ids: list[str]) -> Workload:
    """Every session's turns, each a user message, all sessions at once and with no tool gap."""
    def turns(index: int) -> tuple[Turn, ...]:
        return tuple(Turn(None, 0.0, ({"role": "user", "content": text},), 0, settings.max_tokens, THINK, APPEND)
                     for text in session_turns(settings, routing, index))

    sessions = tuple(SessionScript(session_id, 0.0, "", turns(i)) for i, session_id in enumerate(session_ids))
    return Workload(f"upstream-{routing}", sessions, {"routing": routing})


async def all_sessions(url: str, settings: UpstreamBenchSettings, routing: str,
                       session_ids: list[str] | None = None) -> list[TurnResult]:
    """The sessions through the harness's chat client with their session ids; any failure raises."""
    ids = session_ids or [f"{routing}-{i}" for i in range(settings.sessions)]
    pool = HttpPool(url, REQUEST_TIMEOUT_S)
    try:
        result = await drive(routing_workload(settings, routing, ids), chat_opener(pool, settings.model, True),
                             RunLimits(3600.0, request_timeout_s=REQUEST_TIMEOUT_S), lambda record: None)
    finally:
        await pool.close()
    failures = [r.error for r in result.records if r.error] + result.session_errors
    if failures:
        raise RuntimeError(f"the {routing} run failed: {failures[:3]}")
    index = {session_id: i for i, session_id in enumerate(ids)}
    return sorted((TurnResult(index[r.session_id], r.turn, r.prompt_tokens, r.cached_tokens, r.ttft_s or r.e2e_s or 0.0)
                   for r in result.records), key=lambda t: (t.session, t.turn))


def run_routing(settings: UpstreamBenchSettings, upstreams: list[str], routing: str,
                log_dir: Path) -> list[TurnResult]:
    with running_gateway(settings.model, front_env(upstreams, routing), log_dir / f"front-{routing}.log") as front:
        return asyncio.run(all_sessions(front.url, settings, routing))
