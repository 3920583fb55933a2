"""Chat completion objects and SSE chunks, built from the engine's per-step outputs.

With tools in the request, text from `<tool_call>` on is held back while streaming and sent as
`tool_calls` deltas when the choice finishes, so clients never see tool-call markup as content.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from engine import RequestOutput, TokenLogprob, fresh_id
from gateway.api.generation import ChoiceResult, Usage
from gateway.api.tool_calls import parse_tool_calls
from gateway.errors import ClientGone
from trajectory import step_timer
from trajectory.json_codec import dumps
from trajectory.template.types import Message

TOOL_CALL_OPEN = "<tool_call>"
SSE_DONE = b"data: [DONE]\n\n"
Chunk = dict[str, Any]
T = TypeVar("T")


class ChatStreamWriter:
    """The choices of one chat completion as they grow; with `stream`, the SSE chunks each output gives."""

    def __init__(self, model: str, parse_tools: bool, n: int,
                 decode: Callable[[list[int]], str] = lambda ids: "", max_tool_calls: int | None = None,
                 stream: bool = True) -> None:
        self.model, self.parse_tools, self.decode, self.max_tool_calls = model, parse_tools, decode, max_tool_calls
        self.stream = stream
        self.id, self.created = fresh_id("chatcmpl-"), int(time.time())
        self.choices = [ChoiceResult(i) for i in range(n)]
        self._sent_chars = [0] * n
        self._parsed: dict[int, tuple[str, list[dict[str, Any]]]] = {}

    def add(self, index: int, out: RequestOutput) -> list[Chunk]:
        """Record an output; the stream chunks it gives (none without `stream`)."""
        choice = self.choices[index]
        first = not choice.token_ids and not choice.text
        choice.add(out)
        if not self.stream:
            return []
        chunks = [self._chunk(index, {"role": "assistant", "content": ""})] if first else []
        delta = self._content_delta(index, out.finished)
        if delta or out.logprobs:
            chunks.append(self._chunk(index, {"content": delta}, logprobs=self._logprobs(out.logprobs)))
        if out.finished:
            chunks.append(self._finish_chunk(index))
        return chunks

    def reply(self, index: int) -> Message:
        """The finished choice as the assistant message the client got, tool call ids included."""
        content, calls = self._parse(index)
        return Message("assistant", content, calls or None)

    def _parse(self, index: int) -> tuple[str, list[dict[str, Any]]]:
        """Content and tool calls of a finished choice, parsed once: a call without an id gets a fresh one,
        and the stream, the completion object and the session's history must all show the same."""
        if index not in self._parsed:
            text = self.choices[index].text
            self._parsed[index] = parse_tool_calls(text, self.max_tool_calls) if self.parse_tools else (text, [])
        return self._parsed[index]

    def _content_delta(self, index: int, finished: bool) -> str:
        choice = self.choices[index]
        visible = self._parse(index)[0] if finished else _visible(choice.text, self.parse_tools)
        delta = visible[self._sent_chars[index]:]
        self._sent_chars[index] = max(self._sent_chars[index], len(visible))
        return delta

    def _finish_chunk(self, index: int) -> Chunk:
        calls = self._parse(index)[1]
        delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]} if calls else {}
        return self._chunk(index, delta, finish_reason=_finish_reason(self.choices[index], bool(calls)))

    def _chunk(self, index: int, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> Chunk:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}

    def _logprobs(self, logprobs: list[TokenLogprob]) -> dict[str, Any] | None:
        return {"content": [self._logprob_entry(lp) for lp in logprobs]} if logprobs else None

    def _logprob_entry(self, lp: TokenLogprob) -> dict[str, Any]:
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            token = self.decode([token_id])
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}

    def usage_chunk(self, usage: Usage) -> Chunk:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage.as_openai()}

    def completion(self, usage: Usage) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [self._choice_object(c) for c in self.choices], "usage": usage.as_openai()}

    def _choice_object(self, choice: ChoiceResult) -> dict[str, Any]:
        content, calls = self._parse(choice.index)
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        return {"index": choice.index, "message": message, "logprobs": self._logprobs(choice.logprobs),
                "finish_reason": _finish_reason(choice, bool(calls))}


def _finish_reason(choice: ChoiceResult, has_calls: bool) -> str | None:
    if has_calls and choice.finish_reason == "stop":
        return "tool_calls"
    return "stop" if choice.finish_reason == "abort" else choice.finish_reason


def _visible(text: str, parse_tools: bool) -> str:
    """Streamable content: with tools, nothing from a (possibly partial) `<tool_call>` on."""
    if not parse_tools:
        return text
    start = text.find(TOOL_CALL_OPEN)
    if start >= 0:
        return text[:start]
    for size in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(TOOL_CALL_OPEN[:size]):
            return text[:-size]
    return text


class FastJSONResponse(Response):
    """Starlette's JSONResponse (compact UTF-8 JSON), serialized by orjson (`trajectory.json_codec`)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    step_timer.enter("serialize")
    response = FastJSONResponse(content, status_code, headers)
    step_timer.leave("serialize")
    return response


def sse(data: dict[str, Any]) -> bytes:
    step_timer.enter("serialize")
    chunk = b"data: " + dumps(data) + b"\n\n"
    step_timer.leave("serialize")
    return chunk


def sse_error(error: Exception) -> bytes:
    """An error after the stream started, reported in-band as OpenAI does."""
    return sse({"error": {"message": str(error), "type": "internal_error", "param": None, "code": None}})


async def started(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """The events with the first one already awaited: a bad request raises here, before the response has
    started, so it still gets an HTTP error status."""
    iterator = aiter(events)
    try:
        first = await anext(iterator)
    except StopAsyncIteration:
        return iterator

    async def chained() -> AsyncIterator[T]:
        yield first
        async for event in iterator:
            yield event

    return chained()


async def drain(events: AsyncIterator[object]) -> None:
    async for _ in events:
        pass


async def until_done_or_gone(work: Coroutine[Any, Any, None], request: Request) -> None:
    """Run a non-streaming request's work to its end, unless the client disconnects first: then the work is
    cancelled (which aborts its engine request and frees the KV) and ClientGone raised.

    The work runs in the request's own task, and a watcher task cancels that task if the disconnect comes: once
    the body is read, the server's next `receive` message is the disconnect. (Starlette's
    `Request.is_disconnected` polled every 0.25 s cost a task repr per poll in anyio's cancel scope: 5-9% of the
    event loop's time at 64 concurrent requests; running the work in a task of its own cost a task and a loop
    iteration between the last output and the response.)"""
    task = asyncio.current_task()
    assert task is not None, "called from a request's task"
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _disconnected(request)
        gone = True
        task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await work
    except asyncio.CancelledError:
        if not gone:
            raise  # cancelled from outside (a shutdown): not the client's doing
        task.uncancel()
        raise ClientGone from None
    finally:
        watcher.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def sse_response(events: AsyncIterator[tuple[int, list[Chunk]]], writer: ChatStreamWriter,
                       usage: Usage | None) -> StreamingResponse:
    iterator = await started(events)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for _, chunks in iterator:
                for chunk in chunks:
                    yield sse(chunk)
            if usage is not None:
                yield sse(writer.usage_chunk(usage))
        except Exception as error:  # the stream has started
            yield sse_error(error)
        yield SSE_DONE

    return StreamingResponse(body(), media_type="text/event-stream")
