"""The body of a Responses API request (`POST /v1/responses`, a WebSocket `response.create`) and its input
items turned into the chat messages a session's history holds."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from engine import SamplingDefaults
from gateway.api.protocol import RequestBody, ToolChoice, content_text, is_text_part
from gateway.errors import APIError
from trajectory.template.types import Message, Role

INPUT_ROLES: dict[str, Role] = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


class ResponseCreateRequest(RequestBody):
    """Every field is implemented; others are refused unless null or a no-op (see `gateway.api.protocol`)."""

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default="", validate_default=True)  # missing: refused as empty
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True  # False: only the first tool call the model writes is kept
    max_output_tokens: int | None = Field(default=None, ge=1)
    # Unset (None): the model's default (engine/core/sampling/defaults.py); OpenAI's without one
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)  # vLLM's extension
    ignore_eos: bool = False  # vLLM's extension: generate max_output_tokens whatever the model says
    text: dict[str, Any] | None = None  # {"format": {...}}: text, json_object or json_schema (gateway.api.structured)
    metadata: dict[str, str] | None = None
    user: str | None = None  # an end-user id, echoed; it changes no output (OpenAI uses it for abuse monitoring)
    stream: bool = False
    store: bool = True
    generate: bool = True  # False: a warm-up that only prefills the input into the session's KV
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: prefix reuse only within it

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if not value:
            raise PydanticCustomError("empty_input", "the input is empty: send a string or at least one item")
        return value

    def sampling(self, defaults: SamplingDefaults) -> dict[str, Any]:
        """The request's sampling: what it sets, the model's defaults for the rest (Responses has no top_k)."""
        return defaults.resolve(self.temperature, self.top_p, None, self.min_p)

    def echo(self, sampling: dict[str, Any]) -> dict[str, Any]:
        """The request fields a response object repeats, with the sampling it runs with."""
        return {"instructions": self.instructions, "previous_response_id": self.previous_response_id,
                "tools": self.tools or [], "tool_choice": self.tool_choice,
                "parallel_tool_calls": self.parallel_tool_calls, "max_output_tokens": self.max_output_tokens,
                "temperature": sampling["temperature"], "top_p": sampling["top_p"], "metadata": self.metadata or {},
                "user": self.user, "store": self.store, "text": self.text or {"format": {"type": "text"}},
                "truncation": "disabled", "reasoning": None, "background": False}


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses-API function tools ({type, name, parameters}) in the chat-completions form templates expect."""
    if not tools:
        return None
    if any(tool.get("type") != "function" for tool in tools):
        raise APIError(400, "only function tools are supported", param="tools", code="unsupported_tool")
    return [tool if "function" in tool else {"type": "function", "function": {
        key: tool[key] for key in ("name", "description", "parameters") if key in tool}} for tool in tools]


def input_messages(body: ResponseCreateRequest, starting: bool) -> list[Message]:
    system = [Message("system", body.instructions)] if starting and body.instructions else []
    if isinstance(body.input, str):
        return [*system, Message("user", body.input)]
    messages = system
    for index, item in enumerate(body.input):
        messages = _add_item(messages, item, f"input[{index}]")
    return messages


def _add_item(messages: list[Message], item: dict[str, Any], param: str) -> list[Message]:
    kind = item.get("type", "message")
    role = item.get("role")
    if kind == "message" and isinstance(role, str) and role in INPUT_ROLES:
        return [*messages, Message(INPUT_ROLES[role], _text(item.get("content"), param))]
    if kind == "function_call_output":
        return [*messages, Message("tool", _text(item.get("output"), param), tool_call_id=item.get("call_id"))]
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
        if messages and messages[-1].role == "assistant":
            last = messages[-1]
            return [*messages[:-1], Message("assistant", last.content, [*(last.tool_calls or []), call])]
        return [*messages, Message("assistant", "", [call])]
    raise APIError(400, f"{param}: input items of type {kind!r} are not supported", param=param,
                   code="unsupported_input_item")


def _text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(is_text_part(part) for part in content):
        return content_text(content)
    raise APIError(400, f"{param}: only text content is supported", param=param, code="unsupported_content")
