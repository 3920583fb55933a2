"""The one client both servers get: OpenAI chat completions over httpx, greedy, with exactly the requested
number of output tokens (`ignore_eos` for agentserve and vLLM-style servers, `min_tokens` for llama.cpp's
server; each ignores the other's field). Streams are timed per content chunk as they arrive."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from agents_eval.harness.client import SESSION_HEADER, RequestFailed, chat_chunks

PATH = "/v1/chat/completions"


def request_body(model: str, messages: list[dict[str, str]], max_tokens: int, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "min_tokens": max_tokens, "repeat_penalty": 1.0, "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def session_headers(session_id: str | None) -> dict[str, str]:
    return {SESSION_HEADER: session_id} if session_id else {}


@dataclass(frozen=True)
class Stream:
    """One streamed reply: arrival of each chunk with content (seconds after the request was sent) and the
    usage when the server sends it (llama-server does with `stream_options.include_usage`; llama-cpp-python's
    server does not: its output tokens are then the chunks counted, and the turn says so)."""

    text: str
    chunk_times_s: tuple[float, ...]
    e2e_s: float
    usage: dict[str, Any] | None

    @property
    def ttft_s(self) -> float:
        return self.chunk_times_s[0]

    @property
    def output_tokens(self) -> int:
        return int(self.usage["completion_tokens"]) if self.usage else len(self.chunk_times_s)

    @property
    def cached_tokens(self) -> int | None:
        if not self.usage:
            return None
        return int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))

    def decode_tokens_per_s(self) -> float:
        """Tokens after the first over the time from the first chunk to the last (TTFT excluded)."""
        span = self.chunk_times_s[-1] - self.chunk_times_s[0]
        return (self.output_tokens - 1) / span if span > 0 else float("nan")


async def stream_chat(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> Stream:
    start = time.perf_counter()
    times: list[float] = []
    pieces: list[str] = []
    usage: dict[str, Any] | None = None
    async for chunk in chat_chunks(http, body, headers):
        content = "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices", []))
        if content:
            times.append(time.perf_counter() - start)
            pieces.append(content)
        usage = chunk.get("usage") or usage
    if not times:
        raise RequestFailed("the stream ended without any content")
    return Stream("".join(pieces), tuple(times), time.perf_counter() - start, usage)


@dataclass(frozen=True)
class Reply:
    """A non-streamed reply: its latency and usage."""

    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


async def chat(http: httpx.AsyncClient, body: dict[str, Any]) -> Reply:
    start = time.perf_counter()
    response = await http.post(PATH, json=body)
    latency = time.perf_counter() - start
    if response.status_code != 200:
        raise RequestFailed(f"HTTP {response.status_code}: {response.text[:300]}")
    usage = response.json()["usage"]
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return Reply(latency, int(usage["prompt_tokens"]), cached, int(usage["completion_tokens"]))
