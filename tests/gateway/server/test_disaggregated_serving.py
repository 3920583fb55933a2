"""`agentserve serve` with the disaggregated engine (the config says so): the same API through real clients,
sessions routed to the decode worker that holds their KV, per-role worker gauges, and a clean SIGTERM."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from tests.conftest import openai_client
from tests.gateway.conftest import ADMIN, ADMIN_HEADERS, GatewayProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def disaggregated(gateway_process: GatewayProcess) -> tuple[subprocess.Popen[bytes], str]:
    return gateway_process(AGENTSERVE_DISAGGREGATED="true", AGENTSERVE_DEFAULT_MAX_TOKENS="8",
                           AGENTSERVE_DEPLOYMENT_KV_TIMEOUT_S="5", AGENTSERVE_API_KEYS=json.dumps([ADMIN]))


def metric(url: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == f"agentserve:{name}" and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


def metric_reaching(url: str, name: str, at_least: float, timeout_s: float = 30.0, **labels: str) -> float:
    """The metric once it is at least `at_least` (workers report their counters with their load, not at once),
    or its value when `timeout_s` ran out."""
    deadline = time.monotonic() + timeout_s
    value = metric(url, name, **labels)
    while value < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
        value = metric(url, name, **labels)
    return value


def forecaster_samples(url: str) -> list[dict[str, str]]:
    return [sample.labels for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
            for sample in family.samples if sample.name == "agentserve:forecaster_info" and sample.value == 1]


def test_chat_and_streaming_through_the_openai_sdk(disaggregated: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = disaggregated
    client = openai_client(url)
    messages = [{"role": "user", "content": "List the files in the repository. " * 30}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                            stream=True, extra_body={"ignore_eos": True})
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    # The workers' prefix-cache counters reach /metrics once they report idle: both lookups, the second a hit.
    assert metric_reaching(url, "prefix_cache_queries_total", 2 * whole.usage.prompt_tokens) >= \
        2 * whole.usage.prompt_tokens
    assert metric_reaching(url, "prefix_cache_hits_total", whole.usage.prompt_tokens - 16) >= \
        whole.usage.prompt_tokens - 16
    assert metric(url, "num_workers", role="prefill") == 1
    assert metric(url, "num_workers", role="decode") == 1
    for fallback in ("recomputed", "timed_out", "rejected"):  # an idle deployment may prefill on the decoder
        assert metric(url, "kv_transfers_total", outcome=fallback) == 0
    [forecaster] = forecaster_samples(url)  # which one the controller reads, and why
    assert forecaster["forecaster"] in ("lstm", "last_value", "ema") and "MAE" in forecaster["reason"]
    assert metric(url, "load_signal_failures_total") == 0


def test_a_transport_that_always_fails_shows_at_metrics(gateway_process: GatewayProcess) -> None:
    """Every transfer corrupted: requests are still answered (recomputed on the decode worker), and /metrics
    counts each fallback instead of hiding it."""
    _, url = gateway_process(AGENTSERVE_DISAGGREGATED="true", AGENTSERVE_DEFAULT_MAX_TOKENS="4",
                             AGENTSERVE_DEPLOYMENT_KV_FAULT="corrupt_payload",
                             AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_TOKENS="0",  # every prompt crosses
                             AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_UNCACHED_SHARE="0")
    for turn in range(2):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"Turn {turn}: run the tests. " * 10}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert metric_reaching(url, "kv_transfers_total", 2, outcome="recomputed") >= 2
    assert metric(url, "kv_transfers_total", outcome="rejected") >= 2  # each corrupt transfer refused whole
    assert metric(url, "kv_transfers_total", outcome="received") == 0


def test_a_websocket_session_reuses_its_kv_on_the_decode_worker(
        disaggregated: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = disaggregated
    client = openai_client(url)
    previous, usages = None, []
    with client.responses.connect() as connection:
        for turn in range(4):
            observation = f"Observation {turn}: " + "the build log says all tests passed. " * 20
            connection.response.create(model="tiny", input=[{"role": "user", "content": observation}],
                                       previous_response_id=previous, max_output_tokens=6, temperature=0)
            for event in connection:
                if event.type in ("response.completed", "response.incomplete"):
                    previous, usage = event.response.id, event.response.usage
                    break
                assert event.type != "response.failed" and event.type != "error", event
            assert usage is not None
            usages.append(usage)
    for before, after in itertools.pairwise(usages):  # small deltas: prefilled where the KV is
        assert after.input_tokens_details.cached_tokens >= before.input_tokens + before.output_tokens - 16


def salted_ws_session(url: str, salt: str, opening: str, turns: int) -> list[dict[str, Any]]:
    """A Responses WebSocket session under `cache_salt`; each turn's usage."""
    previous, usages = None, []
    with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
        for turn in range(turns):
            text = opening if turn == 0 else f"Observation {turn}: " + "the test run printed one line. " * 20
            ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": text, "temperature": 0,
                                "max_output_tokens": 6, "cache_salt": salt,
                                **({"previous_response_id": previous} if previous else {})}))
            while (event := json.loads(ws.recv(timeout=120)))["type"] not in ("response.completed",
                                                                              "response.incomplete"):
                assert event["type"] not in ("error", "response.failed"), event
            previous = event["response"]["id"]
            usages.append(event["response"]["usage"])
    return usages


def test_a_salted_session_finds_its_own_kv_on_the_decode_worker_and_no_other_salt_does(
        disaggregated: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = disaggregated
    opening = f"Observation {uuid.uuid4().hex}: " + "the build log says all tests passed. " * 20
    usages = salted_ws_session(url, "tenant-a", opening, 3)
    for before, after in itertools.pairwise(usages):  # the handoff and the decode worker's pin keep the salt
        assert after["input_tokens_details"]["cached_tokens"] >= before["input_tokens"] + before["output_tokens"] - 16
    assert salted_ws_session(url, "tenant-b", opening, 1)[0]["input_tokens_details"]["cached_tokens"] == 0


def test_admin_capacity_shows_and_pins_the_split(disaggregated: tuple[subprocess.Popen[bytes], str]) -> None:
    _, url = disaggregated
    report = httpx.get(f"{url}/admin/capacity", headers=ADMIN_HEADERS).json()
    assert report["split"] == {"prefill": 1, "decode": 1} and report["pinned"] is None
    assert sorted(w["role"] for w in report["workers"]) == ["decode", "prefill"]
    assert all(w["prefill_tokens_per_s"] >= 0 and w["prefill_stall_tokens_per_s"] >= 0 for w in report["workers"])
    pinned = httpx.post(f"{url}/admin/capacity", json={"prefill": 0, "decode": 2}, headers=ADMIN_HEADERS).json()
    assert pinned["split"] == {"prefill": 0, "decode": 2} and pinned["pinned"] == {"prefill": 0, "decode": 2}
    assert [e["role"] for e in pinned["events"] if e["kind"] == "move"] == ["decode"]
    assert metric(url, "num_workers", role="decode") == 2
    assert metric(url, "capacity_target_workers", role="decode") == 2
    assert metric(url, "capacity_role_moves_total") >= 1 and metric(url, "capacity_last_move_timestamp_seconds") > 0
    released = httpx.post(f"{url}/admin/capacity", json={"unpin": True}, headers=ADMIN_HEADERS).json()
    assert released["pinned"] is None
    for bad in ({"prefill": 1}, {"prefill": 1, "decode": 1, "unpin": True}, {"prefill": -1, "decode": 2},
                {"prefill": 0, "decode": 0}, {"workers": 3}):
        response = httpx.post(f"{url}/admin/capacity", json=bad, headers=ADMIN_HEADERS)
        assert response.status_code == 400, bad
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_sigterm_stops_the_gateway_and_its_workers(disaggregated: tuple[subprocess.Popen[bytes], str]) -> None:
    process, url = disaggregated
    assert httpx.get(f"{url}/ready").status_code == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
