"""The one OpenAI client of the benchmarks: an agent session's requests, streamed, and the reply record.

- `ChatSession`: HTTP chat completions (httpx, SSE with `stream_options.include_usage`). It resends the
  history the workload's turn asks for; with a session id it adds the `X-Session-Id` header, so the gateway
  keeps the session and prefills only the new messages.
- `WsSession`: the Responses WebSocket (`client.responses.connect()` of the openai SDK), one connection per
  agent session. An "append" turn sends only its new messages with `previous_response_id`; a "last_action"
  turn sends its whole short input (previous reply and new messages) and starts afresh on the connection.
  Events go and come as raw JSON (`send_raw`, `recv_bytes`): the SDK's typed events are validated one by one
  with pydantic, 42% of the benchmark process's py-spy samples at 12.8 sessions/s, on the cores the gateway
  and its workers share; the chat client parses its SSE chunks with `json.loads` alike.
- `chat_chunks`: the SSE chunks of a streamed chat completion or completion; `post_json`: a request answered
  as one JSON body (chat or completions without `stream`, Responses over HTTP).

Every transport sends the same logical content: a turn whose workload speaks function calling carries its
`tools` with every request (chat `tools`; over the WebSocket the Responses form `{type, name, description,
parameters}` in every `response.create`, as a real Responses client sends them), and its `tool` messages
with their `tool_call_id` and `name` (over the WebSocket a `function_call_output` item with its `name`); the
same sampling parameters (greedy, `ignore_eos`, the turn's output length) and metadata.

Every request asks for exactly `max_output_tokens` tokens (`ignore_eos`, greedy). TTFT is timed to the first
streamed token: the first chat chunk carrying a delta (the gateway sends the role chunk with the first
token), or the first `response.output_text.delta` (the terminal event when none came before it).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
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

    def __init__(self, message: str, status: int | None = None, retry_after: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.code = status, retry_after, code


@dataclass(frozen=True)
class Reply:
    """One finished request: its text, TTFT and end-to-end time, each streamed delta's time from the send,
    the usage the server reported, and the HTTP status (101 for a WebSocket turn). A failed request raises
    `RequestFailed` instead, with its status, error and Retry-After."""

    text: str
    ttft_s: float | None
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    token_times_s: tuple[float, ...] = ()
    status: int = 200


class TurnInput(Protocol):
    @property
    def new_messages(self) -> tuple[dict[str, str], ...]: ...
    @property
    def max_output_tokens(self) -> int: ...
    @property
    def history(self) -> str: ...


def turn_tools(turn: TurnInput) -> list[dict[str, Any]]:
    """The chat `tools` the turn offers (a warm-up turn, or a workload without function calling, offers none)."""
    return list(getattr(turn, "tools", ()))


class SessionClient(Protocol):
    async def send(self, turn: TurnInput) -> Reply: ...


class HttpPool:
    """httpx clients lent one per request in flight, each with its own keep-alive connection (one shared
    client's pool serializes a burst; see `gateway_bench_client.Client`)."""

    def __init__(self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> None:
        self.url, self.timeout_s, self.headers = url, timeout_s, dict(headers or {})  # headers: e.g. a proxy's key
        self.idle: list[httpx.AsyncClient] = []
        self.every: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        if not self.idle:
            self.every.append(httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, headers=self.headers))
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
        if tools := turn_tools(turn):
            body["tools"] = tools
        async with self.pool.client() as http:
            reply = await stream_chat(http, body, self.headers)
        self.last_reply = {"role": "assistant", "content": reply.text}
        self.history = [*messages, self.last_reply]
        return reply


async def chat_chunks(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str],
                      path: str = "/v1/chat/completions") -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a streamed chat completion (or, with `path="/v1/completions"`, a completion);
    RequestFailed on an HTTP or in-stream error."""
    async with http.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RequestFailed(f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}",
                                response.status_code, response.headers.get("retry-after"))
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RequestFailed(f"error in the stream: {chunk['error']}", code=_code(chunk["error"]))
            yield chunk


async def post_json(http: httpx.AsyncClient, path: str, body: dict[str, Any],
                    headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A request answered as one JSON body (chat or completions without `stream`, Responses over HTTP);
    RequestFailed, with the status, code and Retry-After, on anything but 200."""
    response = await http.post(path, json=body, headers=headers or {})
    if response.status_code != 200:
        error = _json_error(response)
        raise RequestFailed(f"HTTP {response.status_code}: {response.text[:300]}", response.status_code,
                            response.headers.get("retry-after"), _code(error))
    answer: dict[str, Any] = response.json()
    return answer


def _json_error(response: httpx.Response) -> Any:
    try:
        return response.json().get("error")
    except ValueError:
        return None


def _code(error: Any) -> str | None:
    """An OpenAI-shaped error's code (or type); None where the error is not in that shape."""
    if not isinstance(error, dict):
        return None
    return error.get("code") or error.get("type")


async def stream_chat(http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]) -> Reply:
    start = time.perf_counter()
    times: list[float] = []
    text, usage = [], None
    async for chunk in chat_chunks(http, body, headers):
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta:
                times.append(time.perf_counter() - start)
            text.append(delta.get("content") or "")
        usage = chunk.get("usage") or usage
    if usage is None:
        raise RequestFailed("the stream ended without usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Reply("".join(text), times[0] if times else None, time.perf_counter() - start, usage["prompt_tokens"],
                 cached, usage["completion_tokens"], tuple(times))


class RawWebSocket:
    """A `websockets` connection with the two calls `WsSession` makes of the openai SDK's (`send_raw`,
    `recv_bytes`): for a client that opens the socket itself (`ws_url`), one per turn or per session."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def send_raw(self, data: str) -> None:
        await self.connection.send(data)

    async def recv_bytes(self) -> str | bytes:
        frame: str | bytes = await self.connection.recv()
        return frame


def ws_url(http_url: str) -> str:
    """The Responses WebSocket of a gateway at `http_url`."""
    return http_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/v1/responses"


class WsSession:
    """One agent session over the Responses WebSocket; `previous_id` continues a response of an earlier
    connection, `on_delta` (if set) sees each text delta as it comes (and may raise to drop the stream)."""

    def __init__(self, connection: Any, model: str, system: str, previous_id: str | None = None) -> None:
        self.connection, self.model, self.system = connection, model, system
        self.previous_id = previous_id
        self.last_reply = ""
        self.on_delta: Callable[[str], None] | None = None

    def event(self, turn: TurnInput) -> dict[str, Any]:
        event: dict[str, Any] = {"type": "response.create", "model": self.model, "temperature": 0,
                                 "ignore_eos": True, "max_output_tokens": turn.max_output_tokens,
                                 "metadata": AGENT_METADATA}
        if tools := turn_tools(turn):
            event["tools"] = [responses_tool(tool) for tool in tools]
        continuing = turn.history == "append" and self.previous_id is not None
        new = [ws_item(message) for message in turn.new_messages]
        if continuing:
            return {**event, "input": new, "previous_response_id": self.previous_id}
        earlier = [{"role": "assistant", "content": self.last_reply}] if self.previous_id is not None else []
        return {**event, "input": [*earlier, *new], "instructions": self.system or None}

    async def send(self, turn: TurnInput) -> Reply:
        start = time.perf_counter()
        await self.connection.send_raw(json.dumps(self.event(turn)))
        times: list[float] = []
        text: list[str] = []
        while True:
            try:
                event = json.loads(await self.connection.recv_bytes())
            except ConnectionClosed as closed:
                raise RequestFailed(f"the WebSocket closed during a turn: {closed}") from closed
            kind = event.get("type")
            if kind == "response.output_text.delta":
                times.append(time.perf_counter() - start)
                text.append(event["delta"])
                if self.on_delta is not None:
                    self.on_delta(event["delta"])
            elif kind in WS_DONE:
                return self._finish(event["response"], times, "".join(text), time.perf_counter() - start)
            elif kind in WS_FAILED:
                error = _ws_error(event)
                raise RequestFailed(f"{kind}: {error}", event.get("status"), code=_code(error))

    def _finish(self, response: dict[str, Any], times: list[float], text: str, e2e: float) -> Reply:
        self.previous_id, self.last_reply = response["id"], text
        usage = response["usage"]
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
        return Reply(text, times[0] if times else e2e, e2e, usage["input_tokens"], cached, usage["output_tokens"],
                     tuple(times), status=101)


def responses_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool `{type, function: {name, description, parameters}}` in the Responses form."""
    function = tool.get("function")
    return {"type": "function", **function} if isinstance(function, dict) else tool


def ws_item(message: dict[str, str]) -> dict[str, str]:
    """A chat message as a Responses input item: a tool message as `function_call_output`, its name kept."""
    if message["role"] != "tool":
        return message
    item = {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
    return item | ({"name": message["name"]} if "name" in message else {})


def _ws_error(event: dict[str, Any]) -> Any:
    return event.get("error") or (event.get("response") or {}).get("error")
