"""Structured outputs and forced tool calls through the gateway, on SmolLM2 (the default model, which left to
itself writes a bash block instead of calling a tool): `response_format` on chat and completions, Responses
`text.format`, `tool_choice` required / named / none over chat, Responses HTTP and WebSocket, and each bad
input's 400 naming its parameter, before any compute."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.grammar_spec import GrammarSpec
from gateway.api.structured import output_plan, schema_spec, tool_call_grammar
from gateway.settings import GatewaySettings
from gateway.upstream.request import grammar_fields
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway

LIST_FILES = {"type": "function", "function": {
    "name": "list_files", "description": "List the files in a directory.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                   "additionalProperties": False}}}
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                   "required": ["path", "lines"], "additionalProperties": False}}}
TOOLS = [LIST_FILES, READ_FILE]
ASK = [{"role": "user", "content": "List the files in the directory /tmp/project."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smollm2_url() -> Iterator[str]:
    settings = GatewaySettings(model="smollm2", port=free_port(), default_max_tokens=96)
    with running_gateway(settings, LLMEngine("smollm2", EngineSettings(num_kv_blocks=512))) as url:
        yield url


def valid_call(call: Any, tools: list[dict[str, Any]]) -> bool:
    """The call names one of the tools and its arguments hold exactly that tool's required keys, typed."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    schema = schemas.get(call.function.name)
    arguments = json.loads(call.function.arguments)
    if schema is None or set(arguments) != set(schema["required"]):
        return False
    kinds = {"string": str, "integer": int}
    return all(isinstance(arguments[key], kinds[schema["properties"][key]["type"]]) for key in arguments)


def test_tool_choice_required_always_calls_a_valid_tool(smollm2_url: str) -> None:
    client = openai_client(smollm2_url)
    prompts = ["List the files in /tmp/project.", "Show me what is in the home directory.",
               "Read the first 10 lines of README.md.", "What is 2 + 2?"]
    for prompt in prompts:
        reply = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": prompt}],
                                               tools=TOOLS, tool_choice="required", temperature=0, max_tokens=64)
        calls = reply.choices[0].message.tool_calls or []
        assert calls and all(valid_call(call, TOOLS) for call in calls), (prompt, reply.choices[0].message)


def test_named_function_and_streaming(smollm2_url: str) -> None:
    client = openai_client(smollm2_url)
    named = {"type": "function", "function": {"name": "read_file"}}
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice=named,
                                            temperature=0, max_tokens=64, stream=True, parallel_tool_calls=False)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert len(calls) == 1 and calls[0].function.name == "read_file"
    arguments = json.loads(calls[0].function.arguments)
    assert set(arguments) == {"path", "lines"} and isinstance(arguments["lines"], int)


def test_tool_choice_auto_lets_the_model_answer_in_words(smollm2_url: str) -> None:
    """`auto` with tools: SmolLM2 answers in words (it does not write `<tool_call>` of its own accord, so the lazy
    grammar never takes over) and nothing is parsed as a call."""
    reply = openai_client(smollm2_url).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, temperature=0,
        max_tokens=16)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


@pytest.mark.parametrize(("output", "held"), [
    ('Let me look.\n<tool_call>\n{"name": "list_files", "arguments": {"path": "/tmp"}}', True),
    ('<tool_call>{"name": "read_file", "arguments": {"path": "a", "lines": 3}}</tool_call>', True),
    ('I would call <tool_call>{"name": "rm", "arguments": {}}', False),
    ("No call here, only <tool_", False),
])
def test_tool_choice_auto_holds_a_started_call_to_the_tools_schemas(output: str, held: bool) -> None:
    """The output so far as a decode worker rebuilds it: from its `<tool_call>` on, a call of one of the tools
    holds the grammar (the rest of it is constrained); a call of no tool or no call at all leaves it free."""
    plan = output_plan(TOOLS, "auto", True, None)
    assert plan.parse_tools and plan.grammar is not None and plan.grammar.trigger == "<tool_call>"
    assert output_plan(TOOLS, "auto", True, GrammarSpec("json_object")).grammar == GrammarSpec("json_object")
    tiny = LLMEngine("tiny", EngineSettings(num_kv_blocks=64))
    assert tiny.tokenizer is not None
    tiny.grammars().add("auto", plan.grammar, tiny.tokenizer.encode(output), 0)
    assert tiny.grammars().constrains("auto") is held


def test_tool_choice_none_parses_no_call(smollm2_url: str) -> None:
    reply = openai_client(smollm2_url).chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24)
    assert reply.choices[0].message.tool_calls is None


@pytest.mark.parametrize("strict", [True, False])
def test_chat_json_schema_gives_a_valid_object(smollm2_url: str, strict: bool) -> None:
    reply = openai_client(smollm2_url).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Describe a person."}], temperature=0,
        max_tokens=64, response_format={"type": "json_schema",
                                        "json_schema": {"name": "person", "schema": PERSON, "strict": strict}})
    value = json.loads(reply.choices[0].message.content or "")
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and len(value["name"]) <= 20


def test_json_object_on_chat_and_completions(smollm2_url: str) -> None:
    client = openai_client(smollm2_url)
    ask = "Reply in JSON: an object with a key 'city' for the capital of France."
    chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": ask}],
                                          temperature=0, max_tokens=64, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content or ""), dict), chat.choices[0].message.content
    completion = client.completions.create(model="smollm2", prompt="A JSON object describing a cat:",
                                           temperature=0, max_tokens=48, extra_body={"response_format": {
                                               "type": "json_schema", "json_schema": {"schema": PERSON}}})
    assert set(json.loads(completion.choices[0].text)) == {"name", "age"}


def test_responses_text_format_and_required_call_over_http(smollm2_url: str) -> None:
    client = openai_client(smollm2_url)
    reply = client.responses.create(model="smollm2", input="Describe a person.", temperature=0,
                                    max_output_tokens=64, text={"format": {"type": "json_schema", "name": "person",
                                                                           "schema": PERSON, "strict": True}})
    assert set(json.loads(reply.output_text)) == {"name", "age"}
    assert reply.text.format.type == "json_schema"
    tools: Any = [{"type": "function", **LIST_FILES["function"]}]
    called = client.responses.create(model="smollm2", input=ASK[0]["content"], tools=tools, tool_choice="required",
                                     temperature=0, max_output_tokens=64)
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and calls[0].name == "list_files" and "path" in json.loads(calls[0].arguments)


async def test_responses_websocket_forced_call(smollm2_url: str) -> None:
    tools: Any = [{"type": "function", **READ_FILE["function"]}]
    client = openai.AsyncOpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)
    async with client, client.responses.connect() as connection:
        await connection.response.create(model="smollm2", input="Read README.md.", tools=tools,
                                         tool_choice={"type": "function", "name": "read_file"},
                                         temperature=0, max_output_tokens=64)
        async for event in connection:
            if event.type == "response.completed":
                calls = [i for i in event.response.output if i.type == "function_call"]
                break
    assert len(calls) == 1 and set(json.loads(calls[0].arguments)) == {"path", "lines"}


BAD_INPUTS = [
    ("/v1/chat/completions", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}},
     "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "strnig"}}}}, "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "array", "uniqueItems": True}}}},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "strict": True, "parameters": {"type": "object", "not": {"required": ["a"]}}}}],
        "tool_choice": "required"}, "tools"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"$ref": "#/nowhere"}}}}, "response_format.json_schema.schema"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "strict": True,
                                           "schema": {"type": "object", "if": {}, "then": {}}}}},
     "text.format.schema"),
    ("/v1/responses", {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                       "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
]


@pytest.mark.parametrize(("path", "fields", "param"), BAD_INPUTS)
def test_bad_input_is_a_400_naming_its_parameter(smollm2_url: str, path: str, fields: dict[str, Any],
                                                 param: str) -> None:
    body: dict[str, Any] = {"model": "smollm2", "max_tokens": 8, **fields}
    if path == "/v1/chat/completions":
        body["messages"] = ASK
    elif path == "/v1/completions":
        body["prompt"] = "hi"
    else:
        body = {"model": "smollm2", "input": "hi", **fields}
    before = _requests_run(smollm2_url)
    response = httpx.post(f"{smollm2_url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text
    assert _requests_run(smollm2_url) == before  # refused before the engine saw it


def _requests_run(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("agentserve:requests_total{"))


def test_an_upstream_is_sent_the_grammar_in_fields_it_reads() -> None:
    strict_schema = schema_spec(PERSON, strict=True)
    fields = grammar_fields(strict_schema)
    assert fields == {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": PERSON}}}
    assert grammar_fields(GrammarSpec("json_object")) == {"response_format": {"type": "json_object"}}
    calls = tool_call_grammar(TOOLS, many=False)
    assert grammar_fields(calls) == {"structured_outputs": {"grammar": calls.source}}
    assert grammar_fields(tool_call_grammar(TOOLS, many=False, lazy=True)) == {}  # the upstream parses its own


def test_metrics_count_constrained_requests_and_forced_tokens(smollm2_url: str) -> None:
    openai_client(smollm2_url).chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=48)
    text = httpx.get(f"{smollm2_url}/metrics", timeout=30).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith(("agentserve:structured_", "agentserve:grammar_"))}
    assert values["agentserve:structured_requests_total"] >= 1
    assert values["agentserve:structured_forced_tokens_total"] > 0
    hits, queries = (values[f"agentserve:grammar_compile_cache_{name}_total"] for name in ("hits", "queries"))
    assert queries >= 1 and 0 <= hits <= queries
    assert values["agentserve:grammar_mask_steps_total"] > 0
