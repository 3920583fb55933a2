"""One agent session's requests, streamed, as `agentserve bench --workload` sends them.

- `ChatSession`: HTTP chat completions (httpx, SSE with `stream_options.include_usage`). It resends the
  history the workload's turn asks for; with a session id it adds the `X-Session-Id` header, so the gateway
  keeps the session and prefills only the new messages.
- `WsSession`: the Responses WebSocket (`client.responses.connect()` of the openai SDK), one connection per
  agent session. An "append" turn sends only its new messages with `previous_response_id`; a "last_action"
  turn sends its whole short input (previous reply and new messages) and starts afresh on the connection.
  Events go and come as raw JSON (`send_raw`, `recv_bytes`): the SDK's typed events are validated one by one
  with pydantic, 42% of the benchmark process's py-spy samples at 12.8 sessions/s, on the cores the gateway
  and its workers share; the chat client parses its SSE chunks with `json.loads` alike.

A turn whose workload speaks function calling carries chat `tools` (sent with each chat request) and `tool`
messages; over the WebSocket a tool message goes as a `function_call_output` item.

Every request asks for exactly `max_output_tokens` tokens (`ignore_eos`, greedy). TTFT is timed to the first
streamed token: the first chat chunk carrying a delta (the gateway sends the role chunk with the first
token), or the first `response.output_text.delta` (the terminal event when none came before it).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from websockets.exceptions import ConnectionClosed

SESSION_HEADER = "X-Session-Id"
WS_DONE = ("response.completed", "response.incomplete")
WS_FAILED = ("response.failed", "error")


class RequestFailed(RuntimeError):
    """The gateway answered with an error, or the stream ended before its reply was complete. An HTTP
    refusal keeps its status and Retry-After header (overload is answered 429 or 503 with one)."""

    def __init__(self, message: str, status: int | None = None, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass(frozen=True)
class Reply:
    text: str
    ttft_s: float | None
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


class TurnInput(Protocol):
    @property
    def new_messages(self) -> tuple[dict[str, str], ...]: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def history(self) -> str: ...


class SessionClient(Protocol):
    async def send(self, turn: TurnInput) -> Reply: ...


class HttpPool:
    """httpx clients lent one per request in flight, each with its own keep-alive connection (one shared
    client's pool serializes a burst; see `gateway_bench_client.Client`)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.idle: list[httpx.AsyncClient] = []
        self.every: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        if not self.idle:
            self.every.append(httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s))
            self.idle.append(self.every[-1])
        http = self.idle.pop()
        try:
            yield http
        finally:
            self.idle.append(http)

    async def close(self) -> None:
        for http in self.every:
            await http.aclose()


# Every session of the benchmark is an agent: a user message after its first reply is an observation.
AGENT_METADATA = {"observation_users": "after_assistant"}


def _sampling(max_tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "ignore_eos": True, "max_tokens": max_tokens}


class ChatSession:
    def __init__(self, pool: HttpPool, model: str, system: str, session_id: str | None) -> None:
        self.pool, self.model = pool, model
        self.system = [{"role": "system", "content": system}] if system else []  # "": no system message
        self.headers = {SESSION_HEADER: session_id} if session_id else {}
        self.history: list[dict[str, str]] = list(self.system)
        self.last_reply: dict[str, str] | None = None

    def messages(self, turn: TurnInput) -> list[dict[str, str]]:
        if turn.history == "last_action":
            return [*self.system, *([self.last_reply] if self.last_reply else []), *turn.new_messages]
        return [*self.history, *turn.new_messages]

    async def send(self, turn: TurnInput) -> Reply:
        messages = self.messages(turn)
        body = {"model": self.model, "messages": messages, "stream": True, "metadata": AGENT_METADATA,
                "stream_options": {"include_usage": True}, **_sampling(turn.max_output_tokens)}
        tools = getattr(turn, "tools", ())  # warm-up turns offer none
        if tools:
            body["tools"] = list(tools)
        async with self.pool.client() as http:
            reply = await stream_chat(http, body, self.headers)
        self.last_reply = {"role": "assistant", "content": reply.text}
        self.history = [*messages, self.last_reply]
        return reply


async def chat_chunks(http: httpx.AsyncClient, body: dict[str, Any],
                      headers: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a streamed chat completion; RequestFailed on an HTTP or in-stream error."""
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RequestFailed(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}",
                                response.status_code, response.headers.get("retry-after"))
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RequestFailed(f"error in the stream: {chunk['error']}")
            yield chunk


async def stream_chat(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> Reply:
    start = time.perf_counter()
    ttft, text, usage = None, [], None
    async for chunk in chat_chunks(http, body, headers):
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta and ttft is None:
                ttft = time.perf_counter() - start
            text.append(delta.get("content") or "")
        usage = chunk.get("usage") or usage
    if usage is None:
        raise RequestFailed("the stream ended without usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Reply("".join(text), ttft, time.perf_counter() - start, usage["prompt_tokens"], cached,
                 usage["completion_tokens"])


class WsSession:
    def __init__(self, connection: Any, model: str, system: str) -> None:
        self.connection, self.model, self.system = connection, model, system
        self.previous_id: str | None = None
        self.last_reply = ""

    def event(self, turn: TurnInput) -> dict[str, Any]:
        event: dict[str, Any] = {"type": "response.create", "model": self.model, "temperature": 0,
                                 "ignore_eos": True, "max_output_tokens": turn.max_output_tokens,
                                 "metadata": AGENT_METADATA}
        continuing = turn.history == "append" and self.previous_id is not None
        new = [_ws_item(message) for message in turn.new_messages]
        if continuing:
            return {**event, "input": new, "previous_response_id": self.previous_id}
        earlier = [{"role": "assistant", "content": self.last_reply}] if self.previous_id is not None else []
        return {**event, "input": [*earlier, *new], "instructions": self.system or None}

    async def send(self, turn: TurnInput) -> Reply:
        start = time.perf_counter()
        await self.connection.send_raw(json.dumps(self.event(turn)))
        ttft, text = None, []
        while True:
            try:
                event = json.loads(await self.connection.recv_bytes())
            except ConnectionClosed as closed:
                raise RequestFailed(f"the WebSocket closed during a turn: {closed}") from closed
            kind = event.get("type")
            if kind == "response.output_text.delta":
                ttft = ttft if ttft is not None else time.perf_counter() - start
                text.append(event["delta"])
            elif kind in WS_DONE:
                return self._finish(event["response"], ttft, "".join(text), time.perf_counter() - start)
            elif kind in WS_FAILED:
                raise RequestFailed(f"{kind}: {_ws_error(event)}")

    def _finish(self, response: dict[str, Any], ttft: float | None, text: str, e2e: float) -> Reply:
        self.previous_id, self.last_reply = response["id"], text
        usage = response["usage"]
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        return Reply(text, e2e if ttft is None else ttft, e2e, usage["input_tokens"], cached, usage["output_tokens"])


def _ws_item(message: dict[str, str]) -> dict[str, str]:
    if message["role"] != "tool":
        return message
    return {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}


def _ws_error(event: dict[str, Any]) -> str:
    error = event.get("error") or (event.get("response") or {}).get("error")
    return str(error)
