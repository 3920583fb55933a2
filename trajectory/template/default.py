"""Chat templating: messages -> text -> append-only token ids.

A checkpoint that ships a chat template (`chat_template.jinja`, or `chat_template` in
`tokenizer_config.json`) is rendered with it exactly as `transformers`' `apply_chat_template` does
(`JinjaChatTemplate`). The built-in models, and checkpoints without a template, use `DefaultChatTemplate`,
a ChatML-like format. The built-in sentencepiece tokenizer has no special tokens for its markers, so they
are plain text there. Every message renders on its own, independent of its neighbours:

    <|im_start|>{role}\\n{body}<|im_end|>\\n

- system, user: the body is the content, verbatim.
- assistant: the content, then one line per tool call, each
  `<tool_call>{"id": ..., "name": ..., "arguments": {...}}</tool_call>`; lines joined by "\\n", the content
  line left out when empty. `arguments` holding a JSON string is parsed into its object (kept as the string
  when it is not valid JSON); `id` is left out when the call has none. JSON is compact-spaced
  (`json.dumps` defaults) and keeps non-ASCII characters.
- tool: `<tool_response id="..." name="...">\\n{content}\\n</tool_response>`, the attributes being the
  message's tool_call_id and name as JSON string literals, each left out when unset.
- tools offered to the model, when any, come first as one block, one JSON schema a line:
  `<|im_start|>tools\\n{schema}\\n{schema}<|im_end|>\\n`.
- the generation prompt is `<|im_start|>assistant\\n`; an assistant turn ends with `<|im_end|>\\n`.

Example, a user asking and the assistant calling a tool:

    <|im_start|>user
    Weather in Paris?<|im_end|>
    <|im_start|>assistant
    <tool_call>{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>
    <|im_start|>tool
    <tool_response id="call_1" name="get_weather">
    18°C, cloudy
    </tool_response><|im_end|>
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import is_gguf_path, read_gguf_chat_template
from trajectory.template.incremental import IncrementalRenderer, RenderedTurn
from trajectory.template.jinja import JinjaChatTemplate, find_chat_template
from trajectory.template.types import ROLES, ChatTemplate, ChatTemplateError, Message, Role, ToolSchemas

__all__ = ["ROLES", "ChatTemplate", "ChatTemplateError", "DefaultChatTemplate", "IncrementalRenderer",
           "JinjaChatTemplate", "Message", "RenderedTurn", "Role", "load_chat_template"]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
GENERATION_PROMPT = f"{IM_START}assistant\n"


class DefaultChatTemplate:
    """The ChatML-like format in this module's docstring; every message renders on its own (prefix-stable), so
    it is a `MessageLocalTemplate`."""

    prepend_bos = True
    end_of_turn_text = f"{IM_END}\n"

    def render(self, messages: Sequence[Message], tools: ToolSchemas | None = None,
               add_generation_prompt: bool = False) -> str:
        blocks = [_tools_block(tools)] if tools else []
        blocks += [_block(message.role, _body(message)) for message in messages]
        if add_generation_prompt:
            blocks.append(GENERATION_PROMPT)
        return "".join(blocks)

    def message_text(self, message: Message, first: bool, tools: ToolSchemas | None) -> str:
        head = _tools_block(tools) if first and tools else ""
        return head + _block(message.role, _body(message))

    def generation_prompt(self, first: bool, tools: ToolSchemas | None) -> str:
        return (_tools_block(tools) if first and tools else "") + GENERATION_PROMPT


def load_chat_template(model_dir: Path | None) -> ChatTemplate:
    """The chat template of a checkpoint directory or a GGUF file, or the default one for the built-in model or
    a checkpoint without one."""
    if model_dir is None:
        return DefaultChatTemplate()
    model_dir = Path(model_dir)
    if is_gguf_path(model_dir):
        has_template = read_gguf_chat_template(model_dir) is not None
        return JinjaChatTemplate.from_gguf(model_dir) if has_template else DefaultChatTemplate()
    if find_chat_template(model_dir) is None:
        return DefaultChatTemplate()
    return JinjaChatTemplate.from_checkpoint(model_dir)


def _block(header: str, body: str) -> str:
    return f"{IM_START}{header}\n{body}{IM_END}\n"


def _tools_block(tools: ToolSchemas) -> str:
    return _block("tools", "\n".join(_to_json(tool) for tool in tools))


def _body(message: Message) -> str:
    if message.role == "assistant":
        return _assistant_body(message)
    if message.role == "tool":
        return _tool_response(message)
    return message.content


def _assistant_body(message: Message) -> str:
    lines = [message.content] if message.content else []
    lines += [f"<tool_call>{_to_json(_tool_call_fields(call))}</tool_call>" for call in message.tool_calls or []]
    return "\n".join(lines)


def _tool_call_fields(call: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's {"id", "type", "function": {"name", "arguments"}} (or a bare function) as {id, name, arguments}."""
    function = call.get("function", call)
    fields = {"id": call.get("id"), "name": function.get("name"),
              "arguments": _parsed_arguments(function.get("arguments"))}
    return {key: value for key, value in fields.items() if value is not None}


def _parsed_arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _tool_response(message: Message) -> str:
    attributes = {"id": message.tool_call_id, "name": message.name}
    spelled = "".join(f" {key}={_to_json(value)}" for key, value in attributes.items() if value is not None)
    return f"<tool_response{spelled}>\n{message.content}\n</tool_response>"


def _to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
