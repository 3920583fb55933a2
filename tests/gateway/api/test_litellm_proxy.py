"""Agent sessions through a real LiteLLM proxy (`litellm --config`) with the gateway as its upstream, as in
docs/litellm.md: the session id reaches the gateway (forwarded `X-Session-Id`, or `metadata` for `openai/`),
and each turn reuses the whole previous turn's KV, streamed or not, over chat completions and Responses."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent

from tests.conftest import free_port
from tests.gateway.conftest import GatewayProcess

pytestmark = pytest.mark.slow
PROVIDERS = {"agent-openai": "openai/tiny", "agent-vllm": "hosted_vllm/tiny"}  # proxy model name -> upstream
TURNS = 3


def proxy_config(gateway_url: str) -> dict[str, Any]:
    """The configuration docs/litellm.md documents."""
    models = [{"model_name": name, "litellm_params": {"model": model, "api_base": f"{gateway_url}/v1",
                                                      "api_key": "none"}}
              for name, model in PROVIDERS.items()]
    return {"model_list": models,
            "general_settings": {"forward_client_headers_to_llm_api": True},  # x-* headers go upstream
            "litellm_settings": {"enable_preview_features": True}}  # openai/: the caller's metadata goes upstream


def wait_until_live(url: str, process: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s  # the proxy imports for tens of seconds on a busy CPU
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health/liveliness", timeout=1.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"litellm proxy at {url} did not start (exit code {process.poll()})")


@pytest.fixture(scope="module")
def gateway(gateway_process: GatewayProcess) -> str:
    return gateway_process()[1]


@pytest.fixture(scope="module")
def proxy(gateway: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    """A `litellm --config` process on a free loopback port; yields an openai client holding its master key."""
    folder = tmp_path_factory.mktemp("litellm-proxy")
    (folder / "config.yaml").write_text(yaml.safe_dump(proxy_config(gateway)))
    port, master_key = free_port(), f"sk-{secrets.token_hex(32)}"
    env = {**os.environ, "LITELLM_MASTER_KEY": master_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with open(folder / "proxy.log", "wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("litellm")), "--config", "config.yaml", "--host", "127.0.0.1",
             "--port", str(port)], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_live(url, process)
            with openai.OpenAI(base_url=f"{url}/v1", api_key=master_key, max_retries=0) as client:
                yield client
        finally:
            process.terminate()
            process.wait(timeout=30)


def num_sessions(gateway: str) -> float:
    match = re.search(r"^agentserve:num_sessions ([0-9.e+]+)$", httpx.get(f"{gateway}/metrics").text, re.MULTILINE)
    assert match, "the gateway exports agentserve:num_sessions"
    return float(match.group(1))


def chat_turn(client: openai.OpenAI, model: str, messages: list[dict[str, str]], stream: bool,
              **session: Any) -> tuple[str, Any]:
    """One turn; its reply text and usage."""
    request: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0, **session}
    if not stream:
        reply = client.chat.completions.create(**request)
        return reply.choices[0].message.content or "", reply.usage
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage


def chat_session(client: openai.OpenAI, model: str, stream: bool, **session: Any) -> list[Any]:
    """An agent loop of TURNS turns, each adding an observation; the usage of each turn."""
    messages = [{"role": "system", "content": "You are a terse coding agent."}]
    usages = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Observation {turn}: the test run printed {turn} failures."})
        text, usage = chat_turn(client, model, messages, stream, **session)
        messages.append({"role": "assistant", "content": text})
        usages.append(usage)
    return usages


def assert_session_reuse(usages: list[tuple[int, int, int]]) -> None:
    """(prompt, completion, cached) per turn: each turn's cache holds the whole previous turn, bar its last
    sampled token (its KV is computed with the next turn); plain prefix caching stops at a block boundary."""
    for (prompt, completion, _), (_, _, cached) in itertools.pairwise(usages):
        assert cached >= prompt + completion - 1, usages


def chat_counts(usages: list[Any]) -> list[tuple[int, int, int]]:
    return [(u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens) for u in usages]


SESSION_PLACES = [("agent-openai", "header"), ("agent-vllm", "header"), ("agent-openai", "metadata")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(("model", "place"), SESSION_PLACES)
def test_chat_session_through_proxy(proxy: openai.OpenAI, gateway: str, model: str, place: str,
                                    stream: bool) -> None:
    session_id = f"proxy-{uuid.uuid4().hex}"
    session = ({"extra_headers": {"X-Session-Id": session_id}} if place == "header"
               else {"metadata": {"session_id": session_id}})
    before = num_sessions(gateway)
    usages = chat_counts(chat_session(proxy, model, stream, **session))
    assert num_sessions(gateway) == before + 1
    assert_session_reuse(usages)
    assert all(completion == 4 for _, completion, _ in usages)


def test_hosted_vllm_keeps_metadata_from_the_gateway(proxy: openai.OpenAI, gateway: str) -> None:
    """docs/litellm.md: with `hosted_vllm/`, the proxy does not send `metadata` upstream; use the header."""
    before = num_sessions(gateway)
    chat_session(proxy, "agent-vllm", False, metadata={"session_id": f"proxy-{uuid.uuid4().hex}"})
    assert num_sessions(gateway) == before


@pytest.mark.parametrize("model", PROVIDERS)
def test_responses_chain_through_proxy(proxy: openai.OpenAI, gateway: str, model: str) -> None:
    """`previous_response_id` comes back to the gateway as the id it issued; the last turn streams."""
    before = num_sessions(gateway)
    limits: dict[str, Any] = {"model": model, "max_output_tokens": 16, "temperature": 0}  # less: raised to 16
    first = proxy.responses.create(instructions="You are a terse coding agent.", input="Observation 0: two failures.",
                                   **limits)
    second = proxy.responses.create(previous_response_id=first.id, input="Observation 1: one failure.", **limits)
    events = list(proxy.responses.create(previous_response_id=second.id, input="Observation 2: all pass.",
                                         stream=True, **limits))
    assert first.output_text and second.output_text
    assert events[0].type == "response.created" and any(e.type == "response.output_text.delta" for e in events)
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent)  # incomplete: max_output_tokens
    assert num_sessions(gateway) == before + 1
    usages = [first.usage, second.usage, last.response.usage]
    assert all(usages)
    assert_session_reuse([(u.input_tokens, u.output_tokens, u.input_tokens_details.cached_tokens)
                          for u in usages if u is not None])
