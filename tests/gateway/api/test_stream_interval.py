"""A gateway whose engine streams every 4th token (`EngineSettings.stream_interval`), through the openai SDK: the
first token comes alone, later chunks carry up to 4 tokens with their logprobs, and the text is the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from engine.config import EngineSettings
from engine.workers.coordinator.worker_engine import colocated_engine
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway

INTERVAL = 4
MESSAGES: list[Any] = [{"role": "user", "content": "List the files the last command printed."}]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16)
    engine = colocated_engine("tiny", EngineSettings(num_kv_blocks=1024, stream_interval=INTERVAL))
    with running_gateway(settings, engine) as url, openai.OpenAI(base_url=f"{url}/v1", api_key="x",
                                                                 max_retries=0) as opened:
        yield opened


def test_a_streamed_reply_comes_in_chunks_of_the_interval_with_the_same_text(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=14,
                                           logprobs=True)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=14,
                                            logprobs=True, stream=True)
    per_chunk = [len(chunk.choices[0].logprobs.content) for chunk in stream
                 if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content]
    assert per_chunk == [1, 4, 4, 4, 1]  # 14 tokens: the first, three of the interval, the end's one
    streamed = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=14,
                                              stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices)
    assert text == whole.choices[0].message.content
