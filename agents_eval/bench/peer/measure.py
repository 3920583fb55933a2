"""The three measurements, run against one server at a time through the same client:

- decode: one streamed request at a time, `decode_tokens` output tokens; tokens/s after the first token;
- prefill: one request at a time of about `prefill_tokens` prompt tokens and a one-token reply; prompt
  tokens over the time to that reply;
- agents: `sessions` agent sessions at once, each `turns` streamed turns carrying the whole history
  (with `X-Session-Id` where the server keeps sessions), a refused turn sent again after its Retry-After;
  turns/s, output tokens/s (from each reply's `usage`) and TTFT quantiles (from a turn's first send), in
  every round (`merge_agents` joins the rounds).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agents_eval.bench.peer import workload
from agents_eval.bench.peer.client import Stream, chat, request_body, session_headers, stream_chat
from agents_eval.bench.peer.settings import PeerSettings
from agents_eval.harness.client import HttpPool, RequestFailed
from agents_eval.harness.drive import retry_wait
from agents_eval.harness.stats import percentile

REQUEST_TIMEOUT_S = 1800.0
MAX_REFUSALS = 100  # a turn refused more often than this fails the run
MAX_RETRY_WAIT_S = 30.0
Tick = Callable[[], None]


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    keeps_sessions: bool  # send X-Session-Id


async def warm_up(target: Target) -> None:
    async with httpx.AsyncClient(base_url=target.url, timeout=REQUEST_TIMEOUT_S) as http:
        body = request_body(target.model, [{"role": "user", "content": "Say hello."}], 4, stream=True)
        await stream_chat(http, body, {})


async def decode(target: Target, settings: PeerSettings, tick: Tick) -> dict[str, Any]:
    runs = []
    async with httpx.AsyncClient(base_url=target.url, timeout=REQUEST_TIMEOUT_S) as http:
        for index in range(settings.repeats):
            messages = [{"role": "user", "content": workload.decode_prompt(index)}]
            stream = await stream_chat(http, request_body(target.model, messages, settings.decode_tokens, True), {})
            runs.append({"tokens_per_s": stream.decode_tokens_per_s(), "output_tokens": stream.output_tokens,
                         "chunks": len(stream.chunk_times_s), "ttft_s": stream.ttft_s, "e2e_s": stream.e2e_s})
            tick()
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs), "runs": runs}


async def prefill(target: Target, settings: PeerSettings, tick: Tick) -> dict[str, Any]:
    runs = []
    async with httpx.AsyncClient(base_url=target.url, timeout=REQUEST_TIMEOUT_S) as http:
        for index in range(settings.repeats):
            messages = [{"role": "user", "content": workload.prefill_prompt(index, settings.prefill_tokens)}]
            reply = await chat(http, request_body(target.model, messages, 1, stream=False))
            runs.append({"tokens_per_s": reply.prompt_tokens / reply.latency_s, "prompt_tokens": reply.prompt_tokens,
                         "cached_tokens": reply.cached_tokens, "ttft_s": reply.latency_s})
            tick()
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "prompt_tokens": statistics.median(r["prompt_tokens"] for r in runs), "runs": runs}


async def _session(pool: HttpPool, target: Target, script: workload.SessionScript, session_id: str,
                   settings: PeerSettings, tick: Tick) -> list[dict[str, Any]]:
    history = [{"role": "system", "content": workload.SYSTEM_PROMPT}]
    headers = session_headers(session_id if target.keeps_sessions else None)
    turns = []
    for turn in range(settings.turns):
        history.append({"role": "user", "content": script.user_message(turn)})
        body = request_body(target.model, history, settings.output_tokens, stream=True)
        sent = await _stream_retrying(pool, body, headers)
        stream = sent.stream
        history.append({"role": "assistant", "content": stream.text})
        usage = stream.usage or {}
        turns.append({"session": session_id, "turn": turn, "ttft_s": sent.waited_s + stream.ttft_s,
                      "e2e_s": sent.waited_s + stream.e2e_s, "refusals": sent.refusals, "waited_s": sent.waited_s,
                      "output_tokens": stream.output_tokens, "output_tokens_from_usage": stream.usage is not None,
                      "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": stream.cached_tokens})
        tick()
    return turns


@dataclass(frozen=True)
class SentTurn:
    """A turn's reply after its refusals: TTFT and end-to-end count from the turn's first send."""

    stream: Stream
    refusals: int  # times the server answered 429/503 with a Retry-After before serving it
    waited_s: float  # from the first send to the send that was served


async def _stream_retrying(pool: HttpPool, body: dict[str, Any], headers: dict[str, str]) -> SentTurn:
    """One streamed turn. A refusal (429 or 503 with a Retry-After) is sent again after that many seconds, as
    the harness's drivers do, up to MAX_REFUSALS times; a connection the server dropped is sent again once
    (llama-server closes idle kept-alive ones, which the pool then reuses), as the OpenAI SDK retries one."""
    first = time.perf_counter()
    refusals, reconnected = 0, False
    while True:
        try:
            async with pool.client() as http:
                stream = await stream_chat(http, body, headers)
            return SentTurn(stream, refusals, time.perf_counter() - first - stream.e2e_s)
        except httpx.RemoteProtocolError:
            if reconnected:
                raise
            reconnected = True
        except RequestFailed as error:
            wait = retry_wait(error.status, error.retry_after, MAX_RETRY_WAIT_S)
            if wait is None or refusals == MAX_REFUSALS:
                raise
            refusals += 1
            await asyncio.sleep(wait)


async def agents(target: Target, settings: PeerSettings, tick: Tick) -> dict[str, Any]:
    scripts = workload.sessions(settings.sessions, settings.turns, settings.observation_tokens, settings.seed)
    pool = HttpPool(target.url, REQUEST_TIMEOUT_S)
    start = time.perf_counter()
    try:
        done = await asyncio.gather(*(_session(pool, target, script, f"peer-{settings.seed}-{index}", settings, tick)
                                      for index, script in enumerate(scripts)))
    finally:
        await pool.close()
    return summarize_agents([turn for turns in done for turn in turns], time.perf_counter() - start)


def merge_agents(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Every round's agent sessions: turns/s and output tokens/s the median of the rounds' own figures, TTFT
    quantiles over every round's turns (each turn keeps its round), and each round's figures beside them."""
    turns = [turn | {"round": index} for index, result in enumerate(rounds) for turn in result["per_turn"]]
    ttfts = [t["ttft_s"] for t in turns]
    cached = [r["cached_tokens"] for r in rounds if r["cached_tokens"] is not None]
    return {
        "rounds": len(rounds), "turns": len(turns), "wall_s": sum(r["wall_s"] for r in rounds),
        "turns_per_s": statistics.median(r["turns_per_s"] for r in rounds),
        "output_tokens": sum(r["output_tokens"] for r in rounds),
        "output_tokens_per_s": statistics.median(r["output_tokens_per_s"] for r in rounds),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "cached_tokens": sum(cached) if cached else None, "refusals": sum(r["refusals"] for r in rounds),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rounds),
        "max_prompt_tokens": max(r["max_prompt_tokens"] for r in rounds),
        "round_turns_per_s": [r["turns_per_s"] for r in rounds],
        "round_ttft_p99_s": [r["ttft_p99_s"] for r in rounds], "per_turn": turns,
    }


def summarize_agents(turns: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ttfts = [t["ttft_s"] for t in turns]
    output_tokens = sum(t["output_tokens"] for t in turns)
    cached = [t["cached_tokens"] for t in turns if t["cached_tokens"] is not None]
    return {
        "turns": len(turns), "wall_s": wall_s, "turns_per_s": len(turns) / wall_s,
        "output_tokens": output_tokens, "output_tokens_per_s": output_tokens / wall_s,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "cached_tokens": sum(cached) if cached else None, "refusals": sum(t["refusals"] for t in turns),
        "prompt_tokens": sum(t["prompt_tokens"] or 0 for t in turns),
        "max_prompt_tokens": max((t["prompt_tokens"] or 0 for t in turns), default=0), "per_turn": turns,
    }
