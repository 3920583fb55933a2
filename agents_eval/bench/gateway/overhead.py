"""Gateway overhead: the same short greedy chat requests straight through the gateway's own `AsyncLLMEngine`
(the engine's time per request: submit to last output) and through the gateway over HTTP (aiohttp, from the
client process).

The engine path runs on the gateway's own event loop (uvicorn's thread), so the two paths differ only by the
HTTP front and the gateway's work. They take turns on the same engine, never at once: the requests go in
waves of `concurrency`, and each wave runs through one path, then the other (the first one flipping from
wave to wave), the prefix cache emptied before each, so drift on a shared machine falls on both. The
engine path gets the token ids, masked spans and sampling parameters the gateway builds from the same body.
The gateway's steps are timed on waves of their own, after these (`time_steps`).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents_eval.bench.gateway import steps
from agents_eval.bench.gateway.client import ClientProcess, closed_loop
from agents_eval.bench.gateway.server import RunningGateway, reset_prefix_cache
from engine.core.sampling.sampler import SamplingParams
from engine.model.mask import MaskedSpan
from gateway.api.protocol import ChatCompletionRequest
from trajectory.agent import Trajectory

ENGINE, GATEWAY = "engine", "gateway"
FLOOR_REQUESTS = 200
WORDS = ("list", "files", "open", "read", "config", "parse", "error", "test", "build", "deploy", "fetch", "page",
         "click", "button", "search", "query", "result", "summary", "patch", "diff", "commit", "branch", "log")


@dataclass(frozen=True)
class ChatRequest:
    body: str  # the JSON the client posts
    prompt_ids: list[int]
    masked_spans: list[MaskedSpan]
    params: SamplingParams


@dataclass
class PathSamples:
    """One path's per-request figures at one concurrency level, in request order, pooled over rounds."""

    latency_s: list[float] = field(default_factory=list)  # client-observed (engine path: submit to last output)
    server_s: list[float] = field(default_factory=list)  # gateway path: inside the app
    steps_ns: list[dict[str, int]] = field(default_factory=list)  # gateway path: per step, inside the app
    loop_cpu_s: float = 0.0  # gateway path: CPU time of the server's thread over its waves
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, latency_s: float, completion_tokens: int, cached_tokens: int) -> None:
        self.latency_s.append(latency_s)
        self.completion_tokens += completion_tokens
        self.cached_tokens += cached_tokens


def chat_requests(gw: RunningGateway, count: int, max_tokens: int, seed: int) -> list[ChatRequest]:
    """Short, distinct user prompts (they differ from their first word), greedy, `max_tokens` each."""
    rng = random.Random(seed)
    sessions = gw.state.sessions
    requests = []
    for index in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12)))
        payload = {"model": gw.state.model_name, "max_tokens": max_tokens, "temperature": 0,
                   "messages": [{"role": "user", "content": f"{words} (step {index})"}]}
        body = ChatCompletionRequest.model_validate(payload)
        trajectory = Trajectory.start(f"bench-{index}", sessions.template, sessions.tokenizer, None,
                                      sessions.policies)
        plan = trajectory.add_messages([m.to_message() for m in body.messages])
        requests.append(ChatRequest(json.dumps(payload), plan.prompt_token_ids, plan.masked_spans,
                                    body.sampling_params(gw.state.sampling, max_tokens, body.logprob_count(), 0)))
    return requests


async def _engine_wave(gw: RunningGateway, wave: list[ChatRequest], concurrency: int) -> list[tuple[float, int, int]]:
    async def one(index: int) -> tuple[float, int, int]:
        request, tokens, cached = wave[index], 0, 0
        start = time.perf_counter()
        async for out in gw.engine.generate(request.prompt_ids, request.params, masked_spans=request.masked_spans,
                                            every_token=False):  # as the gateway asks for a reply not streamed
            tokens, cached = tokens + len(out.new_token_ids), out.num_cached_tokens
        return time.perf_counter() - start, tokens, cached

    return await closed_loop(len(wave), concurrency, one)


def run_engine_wave(gw: RunningGateway, wave: list[ChatRequest], concurrency: int, samples: PathSamples) -> None:
    for latency_s, tokens, cached in gw.run_on_server_loop(_engine_wave(gw, wave, concurrency)):
        samples.add(latency_s, tokens, cached)


def run_gateway_wave(gw: RunningGateway, client: ClientProcess, wave: list[ChatRequest], concurrency: int,
                     samples: PathSamples, tag: str) -> None:
    requests = [{"id": f"{tag}-{index}", "body": request.body} for index, request in enumerate(wave)]
    cpu_before = gw.run_on_server_loop(_thread_time())
    results = client.call(op="chat", requests=requests, concurrency=concurrency)["results"]
    samples.loop_cpu_s += gw.run_on_server_loop(_thread_time()) - cpu_before
    for result in results:
        usage = result["usage"]
        samples.add(result["latency_s"], usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
        samples.server_s.append(gw.probe.seconds.pop(result["id"]))
        if result["id"] in gw.probe.steps:
            samples.steps_ns.append(gw.probe.steps.pop(result["id"]))


async def _thread_time() -> float:
    return time.thread_time()


def measure_level(gw: RunningGateway, client: ClientProcess, requests: list[ChatRequest], concurrency: int,
                  rounds: int) -> dict[str, PathSamples]:
    runs = {ENGINE: PathSamples(), GATEWAY: PathSamples()}
    waves = [requests[start:start + concurrency] for start in range(0, len(requests), concurrency)]
    for turn in range(rounds * len(waves)):
        wave = waves[turn % len(waves)]
        for path in (ENGINE, GATEWAY) if turn % 2 == 0 else (GATEWAY, ENGINE):
            if gw.state.in_flight:
                raise RuntimeError("the gateway is still answering requests; the paths must not overlap")
            reset_prefix_cache(gw.engine)
            if path == ENGINE:
                run_engine_wave(gw, wave, concurrency, runs[ENGINE])
            else:
                run_gateway_wave(gw, client, wave, concurrency, runs[GATEWAY], f"c{concurrency}-{turn}")
    runs[GATEWAY].steps_ns = time_steps(gw, client, waves, concurrency)
    return runs


def time_steps(gw: RunningGateway, client: ClientProcess, waves: list[list[ChatRequest]],
               concurrency: int) -> list[dict[str, int]]:
    """Each wave once more through the gateway, step timers on: the gateway's time per request by step. Not
    the latency waves: their probes and wrappers would count in the overhead."""
    samples = PathSamples()
    gw.probe.time_steps = True
    try:
        with steps.instrumented(gw.state):
            for index, wave in enumerate(waves):
                reset_prefix_cache(gw.engine)
                run_gateway_wave(gw, client, wave, concurrency, samples, f"c{concurrency}-steps-{index}")
    finally:
        gw.probe.time_steps = False
    return samples.steps_ns


def warm_up(gw: RunningGateway, client: ClientProcess, requests: list[ChatRequest], concurrency: int) -> None:
    """Both paths, one at a time and in a burst; opens the client's keep-alive connections."""
    for level in (1, concurrency):
        run_engine_wave(gw, requests, level, PathSamples())
        run_gateway_wave(gw, client, requests, level, PathSamples(), f"warm-c{level}")


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000.0, q))


def summarize(runs: dict[str, PathSamples], concurrency: int) -> dict[str, Any]:
    engine, gateway = runs[ENGINE], runs[GATEWAY]
    client_s = [c - s for c, s in zip(gateway.latency_s, gateway.server_s, strict=True)]
    paired_s = [g - e for g, e in zip(gateway.latency_s, engine.latency_s, strict=True)]
    figures: dict[str, Any] = {"concurrency": concurrency, "samples": len(engine.latency_s)}
    for q in (50, 99):
        engine_ms, gateway_ms = percentile_ms(engine.latency_s, q), percentile_ms(gateway.latency_s, q)
        server_ms = percentile_ms(gateway.server_s, q)
        figures[f"p{q}"] = {"engine_ms": engine_ms, "gateway_ms": gateway_ms, "gateway_server_ms": server_ms,
                            "overhead_ms": gateway_ms - engine_ms, "overhead_in_app_ms": server_ms - engine_ms,
                            "client_and_socket_ms": percentile_ms(client_s, q)}
    figures["paired_overhead_p50_ms"] = percentile_ms(paired_s, 50)  # per request, same wave
    figures["tokens"] = {path: {"completion": runs[path].completion_tokens, "cached": runs[path].cached_tokens}
                         for path in runs}
    figures["same_completion_tokens"] = engine.completion_tokens == gateway.completion_tokens
    figures["samples_s"] = {ENGINE: engine.latency_s, GATEWAY: gateway.latency_s,
                            "gateway_server": gateway.server_s}
    figures["steps"] = steps.summarize(gateway.steps_ns)
    figures["gateway_cpu_s_per_request"] = gateway.loop_cpu_s / len(gateway.latency_s)
    return figures


def client_floor(client: ClientProcess, count: int) -> dict[str, float]:
    """`GET /health` one at a time: what the client, loopback and uvicorn cost with next to no app behind them."""
    seconds = client.call(op="floor", count=count)["latency_s"]
    return {"requests": count, "p50_ms": percentile_ms(seconds, 50), "p99_ms": percentile_ms(seconds, 99)}


def measure_overhead(gw: RunningGateway, client: ClientProcess, num_requests: int, levels: tuple[int, ...],
                     rounds: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """{"levels": {"c1": figures, ...}, "client_floor": the health-check round trip}."""
    requests = chat_requests(gw, num_requests, max_tokens, seed)
    warm = chat_requests(gw, min(num_requests, max(levels)), max_tokens, seed + 1000)
    warm_up(gw, client, warm, max(levels))
    results = {f"c{level}": summarize(measure_level(gw, client, requests, level, rounds), level)
               for level in levels}
    return {"levels": results, "client_floor": client_floor(client, FLOOR_REQUESTS)}
