"""Chat and text completions through the openai SDK against a real gateway serving the tiny model.

The model has random weights, so the tests compare the gateway with itself (streaming against
non-streaming, one seed against the same seed) instead of against expected text.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import ADMIN_HEADERS, serving

TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "shell", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0) as opened:
        yield opened


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def sse_data(response: httpx.Response) -> list[str]:
    """The payloads of an SSE response's `data:` lines, in order."""
    return [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]


def test_chat_completion_has_choices_finish_reason_and_usage(client: openai.OpenAI) -> None:
    messages = user("Summarise the repository layout in one line.")
    reply = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=8)
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")
    [choice] = reply.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.completion_tokens == 8 and usage.total_tokens == usage.prompt_tokens + 8
    assert usage.prompt_tokens_details.cached_tokens == 0

    again = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=8)
    assert again.choices[0].message.content == choice.message.content
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 16 <= cached < usage.prompt_tokens and cached % 16 == 0


def test_streaming_deltas_concatenate_to_the_non_streaming_reply(client: openai.OpenAI) -> None:
    messages = user("Explain what a paged KV cache is.")
    whole = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *content_chunks, usage_chunk = chunks
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason] and content_chunks[-1].choices[0].finish_reason
    assert usage_chunk.choices == [] and usage_chunk.usage is not None and whole.usage is not None
    assert (usage_chunk.usage.prompt_tokens, usage_chunk.usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)


def test_stream_ends_with_the_usage_chunk_then_done(gateway_url: str) -> None:
    body = {"model": "tiny", "messages": user("List three shell commands."), "max_tokens": 5, "stream": True}
    with httpx.stream("POST", f"{gateway_url}/v1/chat/completions", json=body, timeout=30) as response:
        plain = sse_data(response)
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{gateway_url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        with_usage = sse_data(response)
    assert plain[-1] == with_usage[-1] == "[DONE]"
    assert all("usage" not in json.loads(data) for data in plain[:-1])
    usage_chunk = json.loads(with_usage[-2])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


def test_n_choices_with_a_seed_are_distinct_and_reproducible(client: openai.OpenAI) -> None:
    def run() -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(model="tiny", messages=user("Pick a file to open."), n=2, seed=7,
                                              temperature=0.9, max_tokens=6)

    first, second = run(), run()
    assert [c.index for c in first.choices] == [0, 1]
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices]
    assert texts[0] != texts[1]
    assert first.usage is not None and first.usage.completion_tokens == 12


def test_n_choices_stream_by_index(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="tiny", messages=user("Pick a file to open."), n=2,
                                                 seed=7, temperature=0.9, max_tokens=6, stream=True))
    whole = client.chat.completions.create(model="tiny", messages=user("Pick a file to open."), n=2, seed=7,
                                           temperature=0.9, max_tokens=6)
    for choice in whole.choices:
        deltas = [c.choices[0].delta for c in chunks if c.choices[0].index == choice.index]
        assert deltas[0].role == "assistant"
        assert "".join(d.content or "" for d in deltas) == choice.message.content


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str | None:
        reply = client.chat.completions.create(model="tiny", messages=user("Write a commit message."),
                                               temperature=0.8, top_p=0.95, seed=seed, max_tokens=8)
        return reply.choices[0].message.content

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_stop_string_ends_the_reply_before_it(client: openai.OpenAI) -> None:
    messages = user("Describe the scheduler.")
    full = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                          logprobs=True)
    text = full.choices[0].message.content or ""
    assert full.choices[0].logprobs is not None and full.choices[0].logprobs.content is not None
    tokens = [entry.token for entry in full.choices[0].logprobs.content]
    stop = next(t for t in tokens[3:] if len(t.strip()) >= 2 and "\ufffd" not in t)
    stopped = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                             stop=[stop, "never-generated"])
    assert stopped.choices[0].message.content == text[:text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12,
                                              stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text[:text.index(stop)]


@pytest.mark.parametrize("limit", [{"max_tokens": 3}, {"max_completion_tokens": 3},
                                   {"max_tokens": 9, "max_completion_tokens": 3}])
def test_max_tokens_and_max_completion_tokens(client: openai.OpenAI, limit: dict[str, int]) -> None:
    reply = client.chat.completions.create(model="tiny", messages=user("Count to ten."), temperature=0,
                                           **limit)  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=user("Name a data structure."), temperature=0,
                                           max_tokens=4, logprobs=True, top_logprobs=3)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and len(logprobs.content) == 4
    for entry in logprobs.content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        top = entry.top_logprobs
        assert len(top) == 3 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert (entry.token, entry.logprob) == (top[0].token, top[0].logprob)  # greedy takes the most likely
    plain = client.chat.completions.create(model="tiny", messages=user("Name a data structure."), temperature=0,
                                           max_tokens=4)
    assert plain.choices[0].logprobs is None
    streamed = client.chat.completions.create(model="tiny", messages=user("Name a data structure."),
                                              temperature=0, max_tokens=4, logprobs=True, top_logprobs=3,
                                              stream=True)
    streamed_tokens = [e.token for c in streamed if c.choices[0].logprobs
                       for e in c.choices[0].logprobs.content or []]
    assert streamed_tokens == [e.token for e in logprobs.content]


def tool_history(tool_output: str, arguments: str = '{"command": "ls"}') -> list[Any]:
    return [*user("What is in the repository?"),
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_output}]


def test_tools_and_a_tool_call_history_are_rendered(client: openai.OpenAI) -> None:
    def prompt_tokens(messages: list[Any], tools: list[Any] | None = None) -> int:
        extra = {"tools": tools} if tools else {}
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                               **extra)  # type: ignore[call-overload]
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage is not None
        return int(reply.usage.prompt_tokens)

    base = prompt_tokens(tool_history("README.md src tests"), TOOLS)
    assert base > prompt_tokens(tool_history("README.md src tests"))  # the tool schemas
    assert base < prompt_tokens(tool_history("README.md src tests docs scripts configs"), TOOLS)  # the result
    assert base < prompt_tokens(tool_history("README.md src tests", '{"command": "ls -la src"}'), TOOLS)
    assert base > prompt_tokens(user("What is in the repository?"), TOOLS)


def test_streaming_with_tools_still_streams_plain_text(client: openai.OpenAI) -> None:
    messages = tool_history("README.md src tests")
    whole = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                           max_tokens=10)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                                 max_tokens=10, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"


def test_text_completions(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="tiny", prompt="def fibonacci(n):", temperature=0, max_tokens=6)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 6
    chunks = list(client.completions.create(model="tiny", prompt="def fibonacci(n):", temperature=0,
                                            max_tokens=6, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


def test_text_completions_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="tiny", prompt="import os", temperature=0, max_tokens=4, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 4
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(4)]
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2 and logprob == max(top.values())  # greedy takes the most likely
    chunks = client.completions.create(model="tiny", prompt="import os", temperature=0, max_tokens=4, logprobs=2,
                                       stream=True)
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []] == \
        logprobs.tokens
    plain = client.completions.create(model="tiny", prompt="import os", temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_text_completions_take_token_ids(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="tiny", prompt=[1, 40, 41, 42, 43], temperature=0, max_tokens=3)
    assert reply.usage is not None and reply.usage.prompt_tokens == 5
    assert reply.choices[0].finish_reason == "length"


def test_models_health_and_ready(client: openai.OpenAI, gateway_url: str) -> None:
    [model] = client.models.list().data
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "agentserve")
    health, ready = httpx.get(f"{gateway_url}/health"), httpx.get(f"{gateway_url}/ready")
    assert (health.status_code, health.text) == (200, "ok")
    assert (ready.status_code, ready.text) == (200, "ready")
    admin = httpx.get(f"{gateway_url}/admin/capacity", headers=ADMIN_HEADERS)
    assert admin.status_code == 404 and admin.json()["error"]["code"] == "no_capacity_controller"


def test_ignore_eos_generates_max_tokens(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Say as much as you like."}]
    for _ in range(3):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=1.0,  # type: ignore[arg-type]
                                               extra_body={"ignore_eos": True})
        assert reply.usage is not None and reply.usage.completion_tokens == 24


def test_extra_message_keys_nulls_and_no_op_parameters_are_accepted(client: openai.OpenAI) -> None:
    """Messages are data (replayed replies carry extra keys); a parameter agentserve lacks passes only when null
    or a value that changes nothing (tests/gateway/api/test_refused_inputs.py refuses the rest)."""
    messages = [{"role": "user", "content": "hi", "annotations": [], "some_future_field": {"x": 1}}]
    reply = client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[call-overload]
                                           max_tokens=2, temperature=0, presence_penalty=0, logit_bias={},
                                           response_format={"type": "text"},
                                           extra_body={"some_new_option": None, "priority": None})
    assert reply.choices[0].finish_reason == "length"


# Sessions: each turn resends the history plus the returned reply and a new message.

@pytest.fixture(scope="module")
def session_client() -> Iterator[openai.OpenAI]:
    """A gateway whose session pins outlast any pause between turns on a loaded machine: the pin's
    time-to-live follows the observed gaps, with a 0.5 s floor by default."""
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTSERVE_TRAJECTORY_TTL__FLOOR_S", "120")
        app = create_app(GatewaySettings(model="tiny", port=port),
                         LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    with serving(app, port) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as opened:
        yield opened


def run_conversation(client: openai.OpenAI, topic: str, turns: int, **session: Any) -> list[Any]:
    """Turn usages of an agent loop; the new message alternates between a user message and a tool result."""
    messages: list[Any] = [{"role": "system", "content": "You are a coding agent."},
                           *user(f"Fix the failing test in {topic}.")]
    usages = []
    for turn in range(turns):
        reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                               max_tokens=5, **session)
        usages.append(reply.usage)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "name": "shell", "tool_call_id": f"call_{turn}",
                         "content": f"exit code {turn}: {topic}"} if turn % 2 else user(f"Go on with step {turn}.")[0])
    return usages


@pytest.mark.parametrize("how", ["header", "metadata"])
def test_a_session_keeps_its_kv_across_turns(session_client: openai.OpenAI, how: str) -> None:
    session_id = f"session-{how}"
    ways: dict[str, dict[str, Any]] = {"header": {"extra_headers": {"X-Session-Id": session_id}},
                                       "metadata": {"metadata": {"session_id": session_id}}}
    usages = run_conversation(session_client, f"the {how} module", 4, **ways[how])
    for previous, usage in itertools.pairwise(usages):
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached >= previous.prompt_tokens + previous.completion_tokens - 1
        assert cached < usage.prompt_tokens


def test_without_a_session_only_full_blocks_are_reused(session_client: openai.OpenAI) -> None:
    usages = run_conversation(session_client, "the anonymous module", 4)
    cached = [usage.prompt_tokens_details.cached_tokens for usage in usages]
    assert all(c % 16 == 0 for c in cached)
    assert any(usage.prompt_tokens_details.cached_tokens < previous.prompt_tokens + previous.completion_tokens - 1
               for previous, usage in itertools.pairwise(usages))


def test_tools_changed_between_turns_reach_the_model(session_client: openai.OpenAI) -> None:
    grep = {"type": "function", "function": {"name": "grep", "description": "Search the repository for a pattern",
                                             "parameters": {"type": "object",
                                                            "properties": {"pattern": {"type": "string"}}}}}

    def two_turns(session_id: str, tools: list[Any]) -> tuple[Any, Any]:
        messages = user("Where is the scheduler defined?")
        headers = {"X-Session-Id": session_id}
        reply = session_client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                       temperature=0, max_tokens=3, extra_headers=headers)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), *user("Search for it.")]
        second = session_client.chat.completions.create(model="tiny", messages=messages, tools=tools,
                                                        temperature=0, max_tokens=3, extra_headers=headers)
        return reply.usage, second.usage

    first, same = two_turns("tools-kept", TOOLS)
    _, more = two_turns("tools-added", [*TOOLS, grep])
    assert same.prompt_tokens_details.cached_tokens >= first.prompt_tokens + first.completion_tokens - 1
    assert more.prompt_tokens > same.prompt_tokens  # the new schema is in the prompt
