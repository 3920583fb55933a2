"""The prefix cache is per API key: one key cannot learn from `cached_tokens` (or timing) whether another key
recently sent a prompt, over chat, completions, Responses HTTP and the Responses WebSocket; the same key
reuses its own prefixes; a request's `cache_salt` isolates further within a key; a deployment that sets
`share_prefix_cache` reuses prefixes across keys (one tenant)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.auth import hash_key
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import serving

ALICE, BOB = "sk-as-alice", "sk-as-bob"
KEYS: list[dict[str, Any]] = [{"name": "alice", "sha256": hash_key(ALICE)}, {"name": "bob", "sha256": hash_key(BOB)}]
Send = Callable[[str, str, str, str | None], int]  # (url, key, prompt, cache_salt) -> cached prompt tokens


def a_long_prompt() -> str:
    """About 900 tokens never sent before (so nothing but this test's requests can have cached it)."""
    return f"Task {uuid.uuid4().hex}: " + " ".join(f"line {i} of the build log says ok." for i in range(60))


def body_with(salt: str | None, **fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "temperature": 0, **fields, **({"cache_salt": salt} if salt else {})}


def chat(url: str, key: str, prompt: str, salt: str | None) -> int:
    body = body_with(salt, messages=[{"role": "user", "content": prompt}], max_tokens=2)
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=60).raise_for_status()
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def completion(url: str, key: str, prompt: str, salt: str | None) -> int:
    body = body_with(salt, prompt=prompt, max_tokens=2)
    response = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=60).raise_for_status()
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def responses_http(url: str, key: str, prompt: str, salt: str | None) -> int:
    body = body_with(salt, input=prompt, max_output_tokens=2)
    response = httpx.post(f"{url}/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=60).raise_for_status()
    return int(response.json()["usage"]["input_tokens_details"]["cached_tokens"])


def responses_ws(url: str, key: str, prompt: str, salt: str | None) -> int:
    with connect(url.replace("http://", "ws://") + "/v1/responses",
                 additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        ws.send(json.dumps(body_with(salt, type="response.create", input=prompt, max_output_tokens=2)))
        while (event := json.loads(ws.recv(timeout=60)))["type"] not in ("response.completed", "response.incomplete"):
            assert event["type"] != "error", event
    return int(event["response"]["usage"]["input_tokens_details"]["cached_tokens"])


SURFACES: dict[str, Send] = {"chat": chat, "completions": completion, "responses": responses_http,
                             "websocket": responses_ws}


def gateway(share_prefix_cache: bool) -> Iterator[str]:
    settings = GatewaySettings(model="tiny", port=free_port(), auth_enabled=True, api_keys=KEYS,
                               share_prefix_cache=share_prefix_cache)
    with serving(create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=4096))), settings.port) as url:
        yield url


@pytest.fixture(scope="module")
def isolated() -> Iterator[str]:
    yield from gateway(share_prefix_cache=False)


@pytest.fixture(scope="module")
def shared() -> Iterator[str]:
    yield from gateway(share_prefix_cache=True)


@pytest.mark.parametrize("surface", SURFACES)
def test_another_key_finds_nothing_and_the_same_key_reuses_its_prefix(isolated: str, surface: str) -> None:
    send, prompt = SURFACES[surface], a_long_prompt()
    assert send(isolated, ALICE, prompt, None) == 0
    assert send(isolated, BOB, prompt, None) == 0  # alice's prompt is no probe for bob
    assert send(isolated, ALICE, prompt, None) >= 800  # alice's own: reused, all but the last partial block
    assert send(isolated, BOB, prompt, None) >= 800  # and now bob's own


@pytest.mark.parametrize("surface", SURFACES)
def test_a_cache_salt_isolates_within_a_key(isolated: str, surface: str) -> None:
    send, prompt = SURFACES[surface], a_long_prompt()
    assert send(isolated, ALICE, prompt, "end-user-1") == 0
    assert send(isolated, ALICE, prompt, "end-user-2") == 0
    assert send(isolated, ALICE, prompt, None) == 0
    assert send(isolated, ALICE, prompt, "end-user-1") >= 800
    assert send(isolated, BOB, prompt, "end-user-1") == 0  # the same salt under another key is another cache


def test_a_shared_deployment_reuses_prefixes_across_keys_but_not_across_salts(shared: str) -> None:
    prompt = a_long_prompt()
    assert chat(shared, ALICE, prompt, None) == 0
    assert chat(shared, BOB, prompt, None) >= 800
    assert chat(shared, BOB, prompt, "end-user-1") == 0


@pytest.mark.parametrize("salt", ["", "x" * 257])
def test_a_cache_salt_out_of_bounds_is_a_400(isolated: str, salt: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "cache_salt": salt}
    response = httpx.post(f"{isolated}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"},
                          timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "cache_salt"
