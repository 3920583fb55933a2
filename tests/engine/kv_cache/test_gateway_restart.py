"""A session continued after its gateway and engine restart: the session comes back from Redis, its KV
from the persistent tier, `cached_tokens` says so, and the reply equals a cold run's."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.kv_cache.settings import KVCacheSettings
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway, serving


def chat(url: str, messages: list[dict[str, Any]], session_id: str) -> Any:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        return client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                              temperature=0, max_tokens=8, extra_headers={"X-Session-Id": session_id})


def opening() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent. " * 12},
            {"role": "user", "content": "Find why the build is red. " * 6}]


def next_turn(messages: list[dict[str, Any]], reply: Any) -> list[dict[str, Any]]:
    return [*messages, reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Tool result: 3 tests failed in test_io.py."}]


def forget_kv(engine: Any) -> None:
    engine.scheduler.pins.expire(float("inf"))
    assert engine.kv.reset_prefix_cache()


@pytest.mark.slow
def test_a_session_survives_a_gateway_and_engine_restart(tmp_path: Path, redis_url: str) -> None:
    kv = KVCacheSettings(disk_path=tmp_path / "disk")
    session_id = f"restart-{uuid.uuid4().hex}"
    messages = opening()
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=1024, kv_cache=kv))
    with running_gateway(GatewaySettings(model="tiny", port=free_port(), redis_url=redis_url), engine) as url:
        first = chat(url, messages, session_id)
    engine.shutdown()
    messages = next_turn(messages, first)

    restarted = LLMEngine("tiny", EngineSettings(num_kv_blocks=1024, kv_cache=kv))
    with running_gateway(GatewaySettings(model="tiny", port=free_port(), redis_url=redis_url), restarted) as url:
        second = chat(url, messages, session_id)
    assert restarted.tiers is not None and restarted.tiers.tiers.decision.loaded > 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == restarted.tiers.tiers.decision.loaded * restarted.settings.block_size

    cold_settings = GatewaySettings(model="tiny", port=free_port())
    app = create_app(cold_settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=1024)))
    cold_id = f"cold-{uuid.uuid4().hex}"
    with serving(app, cold_settings.port) as url:
        cold_first = chat(url, opening(), cold_id)
        app.state.gateway.engine.call(forget_kv)  # runs before the next request: turn 2 computes from scratch
        cold_second = chat(url, next_turn(opening(), cold_first), cold_id)
    assert cold_second.usage.prompt_tokens_details.cached_tokens == 0
    assert cold_first.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens == cold_second.usage.prompt_tokens
    assert second.choices[0].message.content == cold_second.choices[0].message.content
