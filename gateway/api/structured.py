"""Structured outputs and forced tool calls, from OpenAI's request fields to the engine's grammar.

- `response_format` (chat, completions) and Responses `text.format`: `text`, `json_object`, or `json_schema`
  (with `strict`: a schema keyword the grammar library cannot enforce is a 400; without it such keywords are
  ignored, the rest enforced).
- `tool_choice`: `auto` (the model may answer or call; a call it starts, from its `<tool_call>` on, is held to
  the tools' schemas: a lazy grammar, unless `response_format` constrains the whole reply), `none` (no call is parsed),
  `required` (the reply is one or more calls, or exactly one without `parallel_tool_calls`) or a named
  function (one call of it), constrained to valid calls of the tools' JSON schemas in the format the chat
  template teaches and `gateway.api.tool_calls` parses: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Every refusal is a 400 naming the parameter, raised before the request reaches the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine import JSON_OPTIONS, GrammarError, GrammarSpec, check_grammar
from gateway.errors import APIError

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
TRIGGER = "<tool_call>"
MAX_PARALLEL_CALLS = 4  # a small model, free to add calls, repeats its call until max_tokens cuts one in half


@dataclass(frozen=True)
class OutputPlan:
    """What a reply is held to, and whether its tool calls are parsed out of its text."""

    grammar: GrammarSpec | None = None
    parse_tools: bool = False


def response_format_grammar(value: dict[str, Any] | None, param: str, flat: bool = False) -> GrammarSpec | None:
    """The grammar of a `response_format` (`flat`: Responses' `text.format`, whose json_schema fields sit at the
    top level rather than under `json_schema`); None for text."""
    if value is None or value.get("type", "text") == "text":
        return None
    kind = value.get("type")
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind != "json_schema":
        raise APIError(400, f"{param}.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                       param=f"{param}.type", code="invalid_value")
    fields = value if flat else value.get("json_schema")
    where = param if flat else f"{param}.json_schema"
    if not isinstance(fields, dict) or not isinstance(fields.get("schema"), dict):
        raise APIError(400, f"{where}.schema must be a JSON schema object", param=f"{where}.schema",
                       code="invalid_value")
    return checked(schema_spec(fields["schema"], bool(fields.get("strict"))), f"{where}.schema")


def text_format_grammar(text: dict[str, Any] | None) -> GrammarSpec | None:
    """The grammar of a Responses request's `text` ({"format": {...}}); None for text."""
    text_format = (text or {}).get("format")
    if text_format is not None and not isinstance(text_format, dict):
        raise APIError(400, "text.format must be an object", param="text.format", code="invalid_value")
    return response_format_grammar(text_format, "text.format", flat=True)


def schema_spec(schema: dict[str, Any], strict: bool) -> GrammarSpec:
    """Without `strict`, keywords the library cannot enforce are ignored (`lenient`), the rest enforced."""
    return GrammarSpec("json_schema", json.dumps({**schema, "x-guidance": {"lenient": not strict}}))


def checked(spec: GrammarSpec, param: str) -> GrammarSpec:
    try:
        check_grammar(spec)
    except GrammarError as error:
        raise APIError(400, f"{param}: {error}", param=param, code="invalid_schema") from None
    return spec


def output_plan(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None, parallel: bool,
                response_format: GrammarSpec | None) -> OutputPlan:
    """The reply's grammar and tool parsing for chat-completions-form `tools` and `tool_choice` (either API's)."""
    choice = tool_choice or "auto"
    if choice == "none" or not tools:
        if choice not in ("auto", "none"):
            raise APIError(400, f"tool_choice {_shown(choice)} needs tools", param="tool_choice",
                           code="invalid_value")
        return OutputPlan(response_format, False)
    functions = {_name(tool): tool for tool in tools}
    if choice == "auto":
        lazy = None if response_format else checked(tool_call_grammar(list(functions.values()), parallel, True),
                                                    "tools")
        return OutputPlan(response_format or lazy, True)
    if choice == "required":
        chosen, many = list(functions.values()), parallel
    else:
        name = _chosen_name(choice)
        if name not in functions:
            raise APIError(400, f"tool_choice names the function {name!r}, which is not one of the tools "
                           f"{sorted(functions)}", param="tool_choice", code="invalid_value")
        chosen, many = [functions[name]], False
    return OutputPlan(checked(tool_call_grammar(chosen, many), "tools"), True)


def tool_call_grammar(tools: list[dict[str, Any]], many: bool, lazy: bool = False) -> GrammarSpec:
    """Calls of these tools, each `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` with arguments valid
    under the tool's parameters schema; when `many`, up to MAX_PARALLEL_CALLS of them on their own lines. A `lazy`
    grammar starts at the first `<tool_call>` the model writes and allows the whitespace the parser skips around
    the call's object (the model's own habit, `<tool_call>\n{...}\n</tool_call>`, stays valid)."""
    calls = [{"type": "object", "properties": {"name": {"const": _name(tool)}, "arguments": _parameters(tool)},
              "required": ["name", "arguments"], "additionalProperties": False} for tool in tools]
    strict = all(_function(tool).get("strict") for tool in tools)
    options = {**JSON_OPTIONS, "lenient": not strict}
    body = json.dumps({"x-guidance": options, "anyOf": calls})
    repeat = ' ("\\n" call' * (MAX_PARALLEL_CALLS - 1) + ")?" * (MAX_PARALLEL_CALLS - 1) if many else ""
    space = " /[ \\n]*/ " if lazy else " "
    call = f'call: "<tool_call>"{space}body{space}"</tool_call>"'
    return GrammarSpec("lark", f"start: call{repeat}\n{call}\nbody: %json {body}\n", trigger=TRIGGER if lazy else "")


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = _function(tool).get("parameters") or NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise APIError(400, f"the parameters of tool {_name(tool)!r} must be a JSON schema object", param="tools",
                       code="invalid_value")
    return parameters


def _function(tool: Any) -> dict[str, Any]:
    """A tool's function fields: chat's {"type": "function", "function": {...}} or Responses' flat form."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict):
        raise APIError(400, "every tool must be a function tool object", param="tools", code="invalid_value")
    return function


def _name(tool: dict[str, Any]) -> str:
    name = _function(tool).get("name")
    if not isinstance(name, str) or not name:
        raise APIError(400, "every function tool needs a name", param="tools", code="invalid_value")
    return name


def _chosen_name(choice: str | dict[str, Any]) -> str:
    """The function a tool_choice names: chat's {"type": "function", "function": {"name"}} or Responses'
    {"type": "function", "name"}."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function", choice)
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return name
    raise APIError(400, f"tool_choice must be 'auto', 'none', 'required' or a function, got {_shown(choice)}",
                   param="tool_choice", code="invalid_value")


def _shown(choice: str | dict[str, Any]) -> str:
    return repr(choice) if isinstance(choice, str) else json.dumps(choice)
