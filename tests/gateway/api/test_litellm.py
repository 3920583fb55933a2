"""LiteLLM as a client of the gateway, through its OpenAI and hosted vLLM providers."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import litellm
import pytest

MESSAGES = [{"role": "user", "content": "Which test should run first?"}]
PROVIDERS = ["openai/tiny", "hosted_vllm/tiny"]


def request(gateway_url: str, model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "api_base": f"{gateway_url}/v1", "api_key": "x", "messages": MESSAGES,
            "temperature": 0, "max_tokens": 6, "num_retries": 0, **extra}


@pytest.fixture(scope="module", autouse=True)
def sync_dispatch_loop() -> Iterator[None]:
    """litellm's service logger takes `asyncio.get_event_loop()` inside sync calls, which creates a loop that
    nobody closes (an unraisable ResourceWarning at exit): give its sync calls one, closed after the module.
    litellm also keeps every provider client it made, with its open connection to the gateway, until the
    process ends: those are closed after the module too."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    close_cached_clients()
    asyncio.set_event_loop(None)
    loop.close()


def close_cached_clients() -> None:
    """Close the clients litellm cached (sync ones here; async ones are bound to their test's loop, which
    pytest-asyncio has closed, and their connections with it) and forget them."""
    cache = litellm.in_memory_llm_clients_cache
    for client in list(cache.cache_dict.values()):
        close = getattr(client, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            close()
    cache.flush_cache()


@pytest.fixture(scope="module")
def expected(gateway_url: str) -> str:
    """The greedy reply, as the gateway gives it to the openai provider without streaming."""
    reply = litellm.completion(**request(gateway_url, "openai/tiny"))
    return str(reply.choices[0].message.content)


@pytest.mark.parametrize("model", PROVIDERS)
def test_completion(gateway_url: str, expected: str, model: str) -> None:
    reply = litellm.completion(**request(gateway_url, model))
    assert reply.choices[0].message.content == expected and expected
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6 and reply.usage.prompt_tokens > 0


@pytest.mark.parametrize("model", PROVIDERS)
def test_streaming_completion(gateway_url: str, expected: str, model: str) -> None:
    chunks = list(litellm.completion(**request(gateway_url, model, stream=True,
                                               stream_options={"include_usage": True})))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("model", PROVIDERS)
async def test_acompletion(gateway_url: str, expected: str, model: str) -> None:
    reply = await litellm.acompletion(**request(gateway_url, model))
    assert reply.choices[0].message.content == expected
    parts = []
    async for chunk in await litellm.acompletion(**request(gateway_url, model, stream=True)):
        parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    await litellm.close_litellm_async_clients()  # its cached clients belong to this test's event loop
    assert "".join(parts) == expected


def test_errors_reach_litellm_as_its_exceptions(gateway_url: str) -> None:
    with pytest.raises(litellm.NotFoundError, match="`no-such-model` does not exist"):
        litellm.completion(**request(gateway_url, "openai/no-such-model"))
    with pytest.raises(litellm.BadRequestError, match="temperature: Input should be greater than or equal to 0"):
        litellm.completion(**request(gateway_url, "openai/tiny", temperature=-1))
