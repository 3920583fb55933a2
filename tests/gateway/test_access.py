"""API keys, rate limits, VIP sessions, admission control and /metrics, through real uvicorn and clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.auth import hash_key
from gateway.server.app import create_app
from gateway.server.state import GatewayState
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings, LimitSettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import serving

VIP_KEY, LIMITED_KEY, GOLD_KEY = "sk-vip-test", "sk-limited-test", "sk-gold-test"
KEYS: list[dict[str, Any]] = [
    {"name": "vip-agent", "sha256": hash_key(VIP_KEY), "priority": "vip"},
    {"name": "limited", "sha256": hash_key(LIMITED_KEY), "rate_limit": 0.01, "burst": 2},
    {"name": "gold", "sha256": hash_key(GOLD_KEY), "slo_class": "gold"}]  # a class configs/slo.yaml lacks
MESSAGES = [{"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[str, GatewayState]]:
    settings = GatewaySettings(model="tiny", port=free_port(), auth_enabled=True, api_keys=KEYS,
                               default_max_tokens=4)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=512)))
    with serving(app, settings.port) as url:
        yield url, app.state.gateway


def client(url: str, key: str) -> openai.OpenAI:
    return openai_client(url, key)


def test_missing_and_wrong_keys_get_401_in_openai_shape(secured: tuple[str, GatewayState]) -> None:
    url, _ = secured
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
    assert response.status_code == 401 and response.json()["error"]["code"] == "missing_api_key"
    with pytest.raises(openai.AuthenticationError) as wrong:
        client(url, "sk-wrong").chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    assert wrong.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    with pytest.raises(InvalidStatus):
        connect(url.replace("http", "ws") + "/v1/responses", additional_headers={"Authorization": "Bearer x"})


def test_rate_limit_answers_429_with_retry_after(secured: tuple[str, GatewayState]) -> None:
    url, _ = secured
    limited = client(url, LIMITED_KEY)
    for _ in range(2):  # the burst
        limited.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as limit:
        limited.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    assert int(limit.value.response.headers["retry-after"]) >= 1
    assert limit.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]


def test_vip_key_pins_its_session_as_vip(secured: tuple[str, GatewayState]) -> None:
    url, gw = secured
    client(url, VIP_KEY).chat.completions.create(model="tiny", messages=MESSAGES,  # type: ignore[arg-type]
                                                 extra_headers={"X-Session-Id": "vip-session"})
    pin = gw.serving_engine.scheduler.pins.pins[session_key("vip-agent", "vip-session").path]
    assert pin.vip


def test_the_keys_slo_class_reaches_the_engine(secured: tuple[str, GatewayState]) -> None:
    url, _ = secured
    with pytest.raises(openai.BadRequestError, match="slo_class 'gold'"):
        client(url, GOLD_KEY).chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]


def test_metrics_count_requests_tokens_and_rejections(secured: tuple[str, GatewayState]) -> None:
    url, _ = secured
    client(url, VIP_KEY).chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    text = httpx.get(f"{url}/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    names = {name for name, _ in samples}
    for name in ("agentserve:time_to_first_token_seconds_count", "agentserve:prompt_tokens_total",
                 "agentserve:prefix_cache_queries_total", "agentserve:num_requests_running",
                 "agentserve:kv_cache_usage_perc", "agentserve:turns_total"):
        assert name in names, name
    assert samples[("agentserve:rejected_requests_total", (("reason", "missing_api_key"),))] >= 1
    assert samples[("agentserve:prompt_tokens_total", ())] > 0


def test_admission_control_rejects_early_with_retry_after() -> None:
    limits = LimitSettings(ttft_slo_s=0.001, initial_prefill_tokens_per_s=1.0)
    settings = GatewaySettings(model="tiny", port=free_port(), limits=limits, default_max_tokens=4)
    app = create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=256)))
    with serving(app, settings.port) as url:
        first = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
        assert first.status_code == 200  # an empty queue always admits
        app.state.gateway.admission.on_admit("someone-else", 500)  # queued work the SLO cannot absorb
        second = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES})
        assert second.status_code == 503 and second.json()["error"]["code"] == "overloaded"
        assert int(second.headers["retry-after"]) >= 1
        text = httpx.get(f"{url}/metrics").text
    waits = {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text)
             for s in family.samples if s.name == "agentserve:admission_wait_seconds_count"}
    assert waits == {"admitted": 1, "refused": 1}  # each request's wait in line, by how it ended
