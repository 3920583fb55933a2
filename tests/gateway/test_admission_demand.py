"""The work the gateway admits reaches the capacity controller of a disaggregated engine: turns of a session
through real HTTP, their uncached prompt tokens (after turn-delta reuse) and expected output tokens counted
into the controller's demand when admitted, and retired once served."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import ADMIN, ADMIN_HEADERS, serving

pytestmark = pytest.mark.slow


def chat(url: str, history: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    body = {"model": "tiny", "messages": history, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": "agent-3"}, timeout=120)
    return dict(reply.raise_for_status().json())


def test_admitted_turns_reach_the_controller_and_leave_it_when_served() -> None:
    settings = GatewaySettings(model="tiny", port=free_port(), api_keys=[ADMIN])
    engine = WorkerEngine("tiny", EngineSettings(num_kv_blocks=512),
                                 DeploymentSettings(prefill=1, decode=1, kv_timeout_s=5.0), CapacitySettings())
    app = create_app(settings, engine)
    history = [{"role": "system", "content": "You fix bugs."},
               {"role": "user", "content": "Observation: " + "the test suite failed. " * 40}]
    with serving(app, settings.port) as url:
        first = chat(url, history, max_tokens=5)
        history += [first["choices"][0]["message"], {"role": "user", "content": "Observation: fixed."}]
        second = chat(url, history, max_tokens=3)
        report = httpx.get(f"{url}/admin/capacity", headers=ADMIN_HEADERS).json()
    ledger = app.state.gateway.admission
    assert report["admitted"] == {"prefill_tokens": 0, "decode_tokens": 0, "streams": 0, "prompts": 0}
    total = report["admitted_total"]
    assert (total["decode_tokens"], total["streams"], total["prompts"]) == (5 + 3, 2, 2)
    delta = total["prefill_tokens"] - first["usage"]["prompt_tokens"]  # turn 1 had nothing cached
    computed = second["usage"]["prompt_tokens"] - second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < delta <= computed < second["usage"]["prompt_tokens"] // 4  # the turn's delta, not its history
    assert total == {"prefill_tokens": ledger.admitted_total.prefill_tokens, "decode_tokens": 8, "streams": 2,
                     "prompts": 2}
