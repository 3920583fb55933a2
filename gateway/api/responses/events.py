"""One Responses API response as an object and as its stream events, built from the engine's outputs.

The same events go out as SSE (`POST /v1/responses` with `stream`) and as WebSocket frames; each carries a
`sequence_number` counting from 0 within its response. With tools, text from `<tool_call>` on is held
back while streaming and becomes `function_call` output items when the reply finishes.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any

from engine import RequestOutput
from gateway.api.generation import ChoiceResult
from gateway.api.streaming import _visible
from gateway.api.tool_calls import parse_tool_calls
from trajectory import step_timer
from trajectory.json_codec import dumps
from trajectory.template.types import Message

Event = dict[str, Any]
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


@dataclass
class TokenCounts:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def as_usage(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + self.output_tokens}


class ResponseStream:
    """Builds one response: `start()`, `add()` per engine output, then `finish()` or `fail()`."""

    def __init__(self, model: str, echo: dict[str, Any], parse_tools: bool, max_tool_calls: int | None = None) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.model, self.echo, self.parse_tools, self.max_tool_calls = model, echo, parse_tools, max_tool_calls
        self.created_at = int(time.time())
        self.choice = ChoiceResult(0)
        self.counts = TokenCounts()
        self.output: list[dict[str, Any]] = []  # finished output items
        self.reply = Message("assistant")
        self._sequence = itertools.count()
        self._message: dict[str, Any] | None = None  # the message item being streamed
        self._streamed = ""

    def event(self, type_: str, **fields: Any) -> Event:
        return {"type": type_, "sequence_number": next(self._sequence), **fields}

    def start(self) -> list[Event]:
        return [self.event("response.created", response=self.snapshot("in_progress")),
                self.event("response.in_progress", response=self.snapshot("in_progress"))]

    def add(self, out: RequestOutput) -> list[Event]:
        self.choice.add(out)
        self.counts.input_tokens, self.counts.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
        self.counts.output_tokens = len(self.choice.token_ids)
        return [] if out.finished else self._text_events(_visible(self.choice.text, self.parse_tools))

    def add_prefill(self, out: RequestOutput) -> None:
        """A warm-up's output: only its prompt counts."""
        self.counts.input_tokens, self.counts.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens

    def finish(self, with_output: bool = True) -> list[Event]:
        """The remaining events up to the terminal one; `reply` holds the reply for the session's history."""
        text = self.choice.text
        content, calls = parse_tool_calls(text, self.max_tool_calls) if self.parse_tools else (text, [])
        self.reply = Message("assistant", content, calls or None)
        opened = self._message is not None
        status = "incomplete" if with_output and self.choice.finish_reason == "length" else "completed"
        events = self._close_message(content, status) if with_output and (content or not calls or opened) else []
        for call in calls:
            events += self._function_call(call)
        return [*events, self.event(f"response.{status}", response=self.snapshot(status))]

    def fail(self, message: str) -> list[Event]:
        error = {"code": "server_error", "message": message}
        return [self.event("response.failed", response=self.snapshot("failed", error))]

    def snapshot(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        finished = status != "in_progress"
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "model": self.model,
            "output": list(self.output) if finished else [], "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "usage": self.counts.as_usage() if finished else None, **self.echo,
        }

    def _text_events(self, visible: str) -> list[Event]:
        delta = visible[len(self._streamed):] if visible.startswith(self._streamed) else ""
        if not delta:
            return []
        events = [] if self._message else self._open_message()
        self._streamed += delta
        return [*events, self._part_event("response.output_text.delta", delta=delta, logprobs=[])]

    def _open_message(self) -> list[Event]:
        self._message = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress",
                         "role": "assistant", "content": []}
        return [self.event("response.output_item.added", output_index=len(self.output), item=self._message),
                self._part_event("response.content_part.added", part=_text_part(""))]

    def _close_message(self, content: str, status: str) -> list[Event]:
        """The message item's last events; its status is `incomplete` when the reply was cut short."""
        events = [] if self._message else self._open_message()
        rest = content[len(self._streamed):] if content.startswith(self._streamed) else ""
        if rest:
            events.append(self._part_event("response.output_text.delta", delta=rest, logprobs=[]))
        item = {**self._open_item(), "status": status, "content": [_text_part(content)]}
        events += [self._part_event("response.output_text.done", text=content, logprobs=[]),
                   self._part_event("response.content_part.done", part=_text_part(content)),
                   self.event("response.output_item.done", output_index=len(self.output), item=item)]
        self.output.append(item)
        return events

    def _part_event(self, type_: str, **fields: Any) -> Event:
        return self.event(type_, item_id=self._open_item()["id"], output_index=len(self.output), content_index=0,
                          **fields)

    def _open_item(self) -> dict[str, Any]:
        if self._message is None:
            raise RuntimeError("no message item is open")
        return self._message

    def _function_call(self, call: dict[str, Any]) -> list[Event]:
        function, index = call["function"], len(self.output)
        item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                "name": function["name"], "arguments": function["arguments"], "status": "completed"}
        self.output.append(item)
        return [
            self.event("response.output_item.added", output_index=index,
                       item={**item, "arguments": "", "status": "in_progress"}),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                       delta=item["arguments"]),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=item["name"], arguments=item["arguments"]),
            self.event("response.output_item.done", output_index=index, item=item),
        ]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def sse_event(event: Event) -> bytes:
    step_timer.enter("serialize")
    frame = b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"
    step_timer.leave("serialize")
    return frame
