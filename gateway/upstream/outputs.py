"""Upstream deltas as the engine's `RequestOutput`s, so the gateway's writers (chat chunks, Responses events)
serve them as they serve the embedded engine's. Tool calls the upstream returns structured are handed on in
the `<tool_call>` form the writers parse; token ids are the gateway tokenizer's (its session accounting), the
prompt and cached token counts the upstream's own usage once it reports them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import RequestOutput
from gateway.upstream.client import Delta

FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "function_call": "stop"}


@dataclass
class OutputBuilder:
    request_id: str
    prompt_tokens: int  # the gateway's estimate until the upstream's usage arrives
    encode: Callable[[str], list[int]]
    cached_tokens: int = 0
    finish_reason: str | None = None
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> {id, name, arguments}

    def add(self, delta: Delta) -> RequestOutput | None:
        """The output a delta gives, if it carries text; tool calls and usage are held for `finish`."""
        for fragment in delta.tool_calls:
            call = self.calls.setdefault(int(fragment.get("index", len(self.calls))),
                                         {"id": None, "name": "", "arguments": ""})
            function = fragment.get("function") or {}
            call["id"] = fragment.get("id") or call["id"]
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""
        if delta.usage:
            self.prompt_tokens = int(delta.usage.get("prompt_tokens") or self.prompt_tokens)
            details = delta.usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
        if delta.finish_reason:
            self.finish_reason = FINISH_REASONS.get(delta.finish_reason, "stop")
        return self._output(delta.text, False) if delta.text else None

    def finish(self) -> RequestOutput:
        return self._output("".join(self._call_text(call) for _, call in sorted(self.calls.items())), True)

    def _output(self, text: str, finished: bool) -> RequestOutput:
        return RequestOutput(self.request_id, self.encode(text) if text else [], text, finished,
                             self.finish_reason if finished else None, self.prompt_tokens, self.cached_tokens)

    @staticmethod
    def _call_text(call: dict[str, Any]) -> str:
        try:
            arguments: Any = json.loads(call["arguments"]) if call["arguments"] else {}
        except json.JSONDecodeError:
            arguments = call["arguments"]
        body = {"name": call["name"], "arguments": arguments} | ({"id": call["id"]} if call["id"] else {})
        return f"<tool_call>{json.dumps(body)}</tool_call>"
