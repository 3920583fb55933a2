"""The gateway's engine is a process of its own: killed in the middle of a streamed reply, it is started
again and the reply goes on from where it was, whole and identical to an undisturbed one; with no restart
left, requests get a 503; its load shows per worker at /metrics."""

from __future__ import annotations

import os
import signal
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.workers.coordinator.worker_engine import WorkerEngine, colocated_engine
from engine.workers.deployment import DeploymentSettings
from gateway.server.app import build_engine
from gateway.settings import GatewaySettings
from tests.conftest import free_port, openai_client
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.slow
MESSAGES: list[Any] = [{"role": "user", "content": "Describe every file of the repository."}]
GREEDY: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 300, "temperature": 0,
                          "extra_body": {"ignore_eos": True}}


def test_a_killed_engine_process_restarts_and_the_stream_completes() -> None:
    engine = colocated_engine("tiny", EngineSettings(num_kv_blocks=512))
    with running_gateway(GatewaySettings(model="tiny", port=free_port()), engine) as url:
        client = openai_client(url)
        whole = client.chat.completions.create(**GREEDY)
        first_pid = engine.workers[0].pid
        assert first_pid is not None and first_pid != os.getpid()
        pieces = []
        for chunk in client.chat.completions.create(**GREEDY, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
                if len(pieces) == 3:
                    os.kill(first_pid, signal.SIGKILL)
        assert "".join(pieces) == whole.choices[0].message.content
        assert engine.dead_workers == [0] and engine.workers[0].pid not in (None, first_pid)
        again = client.chat.completions.create(**GREEDY)
        assert again.choices[0].message.content == whole.choices[0].message.content


def test_with_no_restart_left_requests_get_503_not_a_hang() -> None:
    deployment = DeploymentSettings.colocated().model_copy(update={"max_restarts": 0})
    engine = WorkerEngine("tiny", EngineSettings(num_kv_blocks=512), deployment)
    with running_gateway(GatewaySettings(model="tiny", port=free_port()), engine) as url:
        pid = engine.workers[0].pid
        assert pid is not None and pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        for _ in range(2):  # the death found by a request, then known
            response = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                                  json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4})
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "engine_unavailable"
            assert response.headers["retry-after"] == "5"


def test_the_engine_process_reports_its_load_per_worker() -> None:
    engine = colocated_engine("tiny", EngineSettings(num_kv_blocks=512))
    with running_gateway(GatewaySettings(model="tiny", port=free_port()), engine) as url:
        openai_client(url).chat.completions.create(**{**GREEDY, "max_tokens": 4})
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
                   for s in family.samples}
    worker = (("node", "local"), ("role", "colocated"), ("worker", "0"))
    assert samples[("agentserve:num_workers", (("role", "colocated"),))] == 1
    assert ("agentserve:worker_num_requests_running", worker) in samples
    assert 0 <= samples[("agentserve:worker_kv_cache_usage_perc", worker)] <= 1


def test_the_gateway_builds_an_engine_process_unless_told_to_debug_in_process() -> None:
    default = build_engine(GatewaySettings(model="tiny"))
    try:
        assert isinstance(default, WorkerEngine) and default.colocated
        assert default.workers[0].pid not in (None, os.getpid())
    finally:
        default.shutdown()
    assert isinstance(build_engine(GatewaySettings(model="tiny", engine_in_process=True)), LLMEngine)
