"""Tool calls in generated text, in the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` form the
default chat template (and Hermes/Qwen-style templates) teach the model, turned into OpenAI's format."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, max_calls: int | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(content without the well-formed tool calls, the calls in OpenAI's shape). Malformed blocks stay text;
    well-formed calls past `max_calls` (`parallel_tool_calls: false` allows one) leave the content uncalled."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in TOOL_CALL.finditer(text):
        call = _openai_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position:match.start()])
        position = match.end()
        if max_calls is None or len(calls) < max_calls:
            calls.append(call)
    kept.append(text[position:])
    return "".join(kept).strip() if calls else text, calls


def _openai_call(body: str) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", {})
    return {
        "id": str(data.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
        "type": "function",
        "function": {"name": data["name"],
                     "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }
