"""Separate `agentserve serve` processes: replicas sharing sessions through Redis, and the SIGTERM drain."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.auth import ANONYMOUS
from gateway.sessions.store import KEY_PREFIX, REDIS_PREFIX, session_key
from tests.conftest import wait_for
from tests.gateway.conftest import GatewayProcess


def chat(url: str, messages: list[dict[str, Any]], session_id: str | None = None) -> Any:
    headers = {"X-Session-Id": session_id} if session_id else {}
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        return client.chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                              temperature=0, max_tokens=8, extra_headers=headers)


def two_turns(first: Callable[[list[dict[str, Any]]], Any],
              second: Callable[[list[dict[str, Any]]], Any]) -> tuple[Any, Any, list[dict[str, Any]]]:
    """Turn 1 through `first`; turn 2 (history, the reply, a tool result) through `second`."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Find why the build is red."}]
    reply = first(messages)
    messages = [*messages, reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "The log says: undefined symbol `step`. Fix it."}]
    return reply, second(messages), messages


Replica = tuple[subprocess.Popen[bytes], str]
DRAIN_TIMEOUT_S = 300  # long enough for the drained 1,200-token stream on a slow or busy host


@pytest.fixture(scope="module")
def replicas(gateway_process: GatewayProcess, redis_url: str) -> list[Replica]:
    """Two gateway processes sharing one Redis, started side by side; the last test drains the second."""
    env = {"AGENTSERVE_REDIS_URL": redis_url, "AGENTSERVE_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S)}
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: gateway_process(**env), range(2)))


@pytest.mark.slow
def test_a_session_continues_on_another_replica_through_redis(replicas: list[Replica], redis_url: str,
                                                              gateway_url: str) -> None:
    (_, url_a), (_, url_b) = replicas
    store = redis.Redis.from_url(redis_url)
    session_id = f"agent-{uuid.uuid4().hex}"
    key = REDIS_PREFIX + session_key(ANONYMOUS, session_id).path  # without auth every session is anonymous's
    sizes = []

    def on_a(messages: list[dict[str, Any]]) -> Any:
        reply = chat(url_a, messages, session_id)
        sizes.append(len(store.get(key) or b""))
        return reply

    turn_1, turn_2, messages = two_turns(on_a, lambda messages: chat(url_b, messages, session_id))
    single_id = f"single-{uuid.uuid4().hex}"
    reference_1, reference_2, _ = two_turns(lambda m: chat(gateway_url, m, single_id),
                                            lambda m: chat(gateway_url, m, single_id))

    assert turn_1.choices[0].message.content == reference_1.choices[0].message.content
    assert turn_2.choices[0].message.content == reference_2.choices[0].message.content
    assert turn_2.usage.prompt_tokens == reference_2.usage.prompt_tokens
    # B continued the session's token history: started afresh, it would render the reply's text anew, and
    # the random model's tokens do not survive that round trip.
    assert chat(gateway_url, messages).usage.prompt_tokens != turn_2.usage.prompt_tokens
    assert key.encode() in store.keys(f"{KEY_PREFIX}*")
    assert len(store.get(key) or b"") > sizes[0] > 0  # B saved the session's second turn
    assert store.pttl(key) > 0


def respond(url: str, text: str, previous: str | None = None) -> httpx.Response:
    body = {"model": "tiny", "input": text, "max_output_tokens": 48, "temperature": 0,
            **({"previous_response_id": previous} if previous else {})}
    return httpx.post(f"{url}/v1/responses", json=body, timeout=60)


@pytest.mark.slow
def test_same_session_turns_on_two_replicas_at_once_never_lose_an_update(replicas: list[Replica]) -> None:
    """Both replicas continue the same response at the same moment: the session's lease lets one turn in at a
    time, so the second loads the session as the first left it (never one version that both save over) and,
    continuing from the response before the latest, takes the session's head, as a retry does. The turn it
    replaced is no longer continuable: its client is told so, not silently continued on the other branch."""
    urls = [url for _, url in replicas]
    latest = respond(urls[0], "Open the failing test.").json()["id"]
    with ThreadPoolExecutor(2) as pool:
        for round_ in range(4):
            text = f"Step {round_}: run it again."
            answers = list(pool.map(respond, urls, [text] * len(urls), [latest] * len(urls)))
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            follows = [respond(url, "Check the output.", a.json()["id"]) for url, a in zip(urls, answers, strict=True)]
            assert sorted(f.status_code for f in follows) == [200, 400], [f.text for f in follows]
            refused = next(f for f in follows if f.status_code == 400).json()["error"]
            assert refused["code"] == "previous_response_not_latest"
            winner = next(f for f in follows if f.status_code == 200).json()
            latest = winner["id"]
    follow = respond(urls[1], "Summarise what changed.", latest)
    assert follow.status_code == 200  # the winner of each round is the session's latest on every replica
    assert follow.json()["usage"]["input_tokens"] > winner["usage"]["input_tokens"] + winner["usage"]["output_tokens"]


@pytest.mark.slow
def test_sigterm_drains_running_streams_then_exits(replicas: list[Replica]) -> None:
    process, url = replicas[1]
    events: list[str] = []
    streaming = threading.Event()

    def stream() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Write the whole changelog."}],
                "max_tokens": 1200, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    streaming.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert streaming.wait(30)
    process.send_signal(signal.SIGTERM)
    assert wait_for(lambda: httpx.get(f"{url}/ready").status_code == 503)
    refused = httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": "one more"}]})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "draining"
    thread.join(DRAIN_TIMEOUT_S)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert process.wait(timeout=DRAIN_TIMEOUT_S + 15) == 0
