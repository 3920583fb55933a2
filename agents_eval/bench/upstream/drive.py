"""One routing run: a front gateway (`agentserve serve` with `AGENTSERVE_UPSTREAMS`) over the replicas, every
session's turns sent in order, the sessions concurrently; per turn the prompt tokens the replica had to
prefill (its prompt less its reported cached tokens) and the time to first token."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from agents_eval.bench.upstream.workload import UpstreamBenchSettings, session_turns
from agents_eval.harness.client import stream_chat
from agents_eval.harness.servers.gateway import running_gateway


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


async def _session(http: httpx.AsyncClient, settings: UpstreamBenchSettings, routing: str,
                   index: int, session_id: str) -> list[TurnResult]:
    messages: list[dict[str, str]] = []
    results = []
    headers = {"X-Session-Id": session_id}
    for turn, text in enumerate(session_turns(settings, routing, index)):
        messages.append({"role": "user", "content": text})
        body = {"model": settings.model, "messages": messages, "max_tokens": settings.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0}
        reply = await stream_chat(http, body, headers)
        messages.append({"role": "assistant", "content": reply.text})
        results.append(TurnResult(index, turn, reply.prompt_tokens, reply.cached_tokens, reply.ttft_s or reply.e2e_s))
    return results


async def all_sessions(url: str, settings: UpstreamBenchSettings, routing: str,
                       session_ids: list[str] | None = None) -> list[TurnResult]:
    ids = session_ids or [f"{routing}-{i}" for i in range(settings.sessions)]
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        runs = await asyncio.gather(*(_session(http, settings, routing, i, session_id)
                                      for i, session_id in enumerate(ids)))
    return [result for run in runs for result in run]


def run_routing(settings: UpstreamBenchSettings, upstreams: list[str], routing: str,
                log_dir: Path) -> list[TurnResult]:
    with running_gateway(settings.model, front_env(upstreams, routing), log_dir / f"front-{routing}.log") as front:
        return asyncio.run(all_sessions(front.url, settings, routing))
