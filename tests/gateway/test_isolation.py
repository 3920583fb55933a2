"""Tenant isolation through real uvicorn and clients: one API key's sessions, stored responses and KV pins are
out of another's reach (its ids are answered exactly as unknown ones) over chat, Responses HTTP and the
Responses WebSocket, on one replica and on two replicas sharing one Redis; admin endpoints need an admin
key; per-key limits on sessions held and open WebSockets."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.sync.connection import Connection

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.auth import hash_key
from gateway.server.app import create_app
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings
from tests.conftest import free_port, wait_for
from tests.gateway.conftest import ADMIN, ADMIN_KEY, serving

ALICE, BOB, CAROL = "sk-as-alice", "sk-as-bob", "sk-as-carol"
KEYS: list[dict[str, Any]] = [
    {"name": "alice", "sha256": hash_key(ALICE), "priority": "vip"},
    {"name": "bob", "sha256": hash_key(BOB)},
    {"name": "carol", "sha256": hash_key(CAROL), "max_sessions": 2, "max_websockets": 1},
    ADMIN]
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


@dataclass
class Deployment:
    """Alice's requests go to the first replica, Bob's to the second (the same one when there is one)."""

    urls: tuple[str, str]
    apps: tuple[FastAPI, FastAPI]

    def pins(self, replica: int) -> dict[str, Any]:
        return dict(self.apps[replica].state.gateway.serving_engine.scheduler.pins.pins)


def make_app(redis_url: str | None) -> tuple[FastAPI, int]:
    settings = GatewaySettings(model="tiny", port=free_port(), auth_enabled=True, api_keys=KEYS,
                               default_max_tokens=4, redis_url=redis_url)
    return create_app(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=512))), settings.port


@pytest.fixture(scope="module", params=["one-replica", "two-replicas-on-redis"])
def deployment(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Deployment]:
    replicas = 1 if request.param == "one-replica" else 2
    apps = [make_app(redis_url if replicas == 2 else None) for _ in range(replicas)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serving(app, port)) for app, port in apps]
        yield Deployment((urls[0], urls[-1]), (apps[0][0], apps[-1][0]))


Sdk = Callable[[str, str], openai.OpenAI]


@pytest.fixture(scope="module")
def sdk() -> Iterator[Sdk]:
    """`sdk(url, key)`: an openai client of that gateway with that key, one per pair, closed after the module."""
    clients: dict[tuple[str, str], openai.OpenAI] = {}

    def client(url: str, key: str) -> openai.OpenAI:
        if (url, key) not in clients:
            clients[url, key] = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        return clients[url, key]

    yield client
    for made in clients.values():
        made.close()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def unknown_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def same_but_for_ids(theirs: Any, unknown: Any, their_id: str, unknown_id_: str) -> bool:
    """Two answers equal once each names its own id the same way."""
    return bool(json.loads(json.dumps(theirs).replace(their_id, "ID")) ==
                json.loads(json.dumps(unknown).replace(unknown_id_, "ID")))


def test_a_stored_response_is_unknown_to_another_key_and_to_no_key(deployment: Deployment, sdk: Sdk) -> None:
    alice, alice_elsewhere = sdk(deployment.urls[0], ALICE), sdk(deployment.urls[1], ALICE)
    first = alice.responses.create(model="tiny", input="The deploy password is hunter2.", max_output_tokens=3,
                                   instructions="Alice's private instructions.", metadata={"team": "alice"},
                                   user="alice-end-user", temperature=0)
    url, missing = deployment.urls[1], unknown_id()
    no_key = httpx.get(f"{url}/v1/responses/{first.id}", timeout=10)
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "missing_api_key"
    assert "hunter2" not in no_key.text and "Alice's" not in no_key.text
    theirs = httpx.get(f"{url}/v1/responses/{first.id}", headers=bearer(BOB), timeout=10)
    unknown = httpx.get(f"{url}/v1/responses/{missing}", headers=bearer(BOB), timeout=10)
    assert theirs.status_code == unknown.status_code == 404
    assert same_but_for_ids(theirs.json(), unknown.json(), first.id, missing)
    mine = httpx.get(f"{url}/v1/responses/{first.id}", headers=bearer(ALICE), timeout=10).json()
    assert (mine["instructions"], mine["metadata"], mine["user"]) == (
        "Alice's private instructions.", {"team": "alice"}, "alice-end-user")

    bob = sdk(deployment.urls[1], BOB)
    errors = []
    for previous in (first.id, missing):
        with pytest.raises(openai.BadRequestError) as refused:
            bob.responses.create(model="tiny", input="Continue.", previous_response_id=previous, max_output_tokens=3)
        errors.append(refused.value.body)
    assert same_but_for_ids(errors[0], errors[1], first.id, missing)
    assert errors[0]["code"] == "previous_response_not_found"  # type: ignore[index]
    second = alice_elsewhere.responses.create(model="tiny", input="Go on.", previous_response_id=first.id,
                                              max_output_tokens=3)
    assert first.usage is not None and second.usage is not None  # the owner continues: history and its KV
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def chat_turns(client: openai.OpenAI, session_id: str, messages: list[dict[str, Any]],
               replies: int) -> tuple[list[dict[str, Any]], Any]:
    """`replies` turns of one conversation, each adding the reply and a tool result; the last usage."""
    usage = None
    for turn in range(replies):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                               temperature=0, extra_headers={"X-Session-Id": session_id})
        usage = reply.usage
        messages = [*messages, reply.choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": f"Tool result {turn}: 3 tests failed."}]
    return messages, usage


def test_a_chat_session_id_names_another_session_under_another_key(deployment: Deployment, sdk: Sdk) -> None:
    alice, alice_elsewhere = sdk(deployment.urls[0], ALICE), sdk(deployment.urls[1], ALICE)
    bob = sdk(deployment.urls[1], BOB)
    opening = [{"role": "system", "content": "You are Alice's release agent."},
               {"role": "user", "content": "Plan the release."}]
    shared, untouched = f"shared-{uuid.uuid4().hex}", f"untouched-{uuid.uuid4().hex}"
    results = []
    for session_id, intruded in ((shared, True), (untouched, False)):
        messages, _ = chat_turns(alice, session_id, opening, 2)
        if intruded:  # Bob, same session id, another conversation: before, this reset Alice's session
            chat_turns(bob, session_id, [{"role": "user", "content": "Hi, I am Bob."}], 1)
        results.append(chat_turns(alice_elsewhere, session_id, messages, 1)[1])
    # A session that kept its token history renders this turn exactly as the untouched one; a session started
    # afresh re-renders the replies' text, which the random model's tokens do not survive.
    assert results[0].prompt_tokens == results[1].prompt_tokens
    pins = deployment.pins(1)
    alice_pin, bob_pin = pins[session_key("alice", shared).path], pins[session_key("bob", shared).path]
    assert alice_pin.vip and not bob_pin.vip  # Bob took neither Alice's KV pin nor her VIP standing


def test_a_chat_session_id_never_reads_a_response_record(deployment: Deployment, sdk: Sdk) -> None:
    alice = sdk(deployment.urls[0], ALICE)
    first = alice.responses.create(model="tiny", input="Start.", max_output_tokens=3)
    reply = alice.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2, extra_headers={"X-Session-Id": f"response:{first.id}"})
    assert reply.choices[0].finish_reason == "length"
    second = alice.responses.create(model="tiny", input="Go on.", previous_response_id=first.id, max_output_tokens=3)
    assert second.previous_response_id == first.id


def test_user_is_not_a_session_id(deployment: Deployment, sdk: Sdk) -> None:
    alice, user = sdk(deployment.urls[0], ALICE), f"end-user-{uuid.uuid4().hex}"
    for text in ("Book a flight.", "Unrelated: summarise this file."):
        alice.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}],
                                      max_tokens=2, user=user)
    assert not [key for key in deployment.pins(0) if user in key]  # no session held, nothing pinned


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/responses"


def create(ws: Connection, **fields: Any) -> list[dict[str, Any]]:
    ws.send(json.dumps({"type": "response.create", "model": "tiny", "max_output_tokens": 3, **fields}))
    events = [json.loads(ws.recv(timeout=30))]
    while events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=30)))
    return events


def test_a_websocket_cannot_continue_another_keys_response(deployment: Deployment) -> None:
    with pytest.raises(InvalidStatus):
        connect(ws_url(deployment.urls[1]), open_timeout=10)
    with connect(ws_url(deployment.urls[0]), additional_headers=bearer(ALICE), open_timeout=10) as alice, \
            connect(ws_url(deployment.urls[1]), additional_headers=bearer(BOB), open_timeout=10) as bob:
        first = create(alice, input="Secret plan: ship on Friday.")[-1]["response"]["id"]
        missing = unknown_id()
        [theirs] = create(bob, input="Continue.", previous_response_id=first, event_id="e1")
        [unknown] = create(bob, input="Continue.", previous_response_id=missing, event_id="e1")
        assert theirs["error"]["code"] == "previous_response_not_found"
        assert same_but_for_ids(theirs, unknown, first, missing)
        bob.send(json.dumps({"type": "session.tool_call.started", "name": "deploy", "event_id": "e2"}))
        assert json.loads(bob.recv(timeout=30))["error"]["code"] == "no_active_session"  # no session of Alice's
        then = create(alice, input="Go on.", previous_response_id=first)[-1]
        assert then["type"] == "response.incomplete" and then["response"]["previous_response_id"] == first


def test_admin_endpoints_need_an_admin_key(deployment: Deployment, gateway_url: str) -> None:
    secured = deployment.urls[0]
    for url in (secured, gateway_url):  # auth on; auth off (gateway_url) with an admin key configured
        no_key = httpx.get(f"{url}/admin/capacity", timeout=10)
        assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "missing_api_key"
        assert no_key.headers["www-authenticate"] == "Bearer"
        admin = httpx.get(f"{url}/admin/capacity", headers=bearer(ADMIN_KEY), timeout=10)
        assert admin.status_code == 404 and admin.json()["error"]["code"] == "no_capacity_controller"
    for method, body in (("GET", None), ("POST", {"prefill": 1, "decode": 1}), ("POST", {"unpin": True})):
        refused = httpx.request(method, f"{secured}/admin/capacity", json=body, headers=bearer(ALICE), timeout=10)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_required"
    wrong = httpx.post(f"{secured}/admin/capacity", json={"unpin": True}, headers=bearer("sk-as-nobody"), timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"


def test_a_key_holds_at_most_its_sessions_on_every_replica(deployment: Deployment, sdk: Sdk) -> None:
    carol, carol_elsewhere = sdk(deployment.urls[0], CAROL), sdk(deployment.urls[1], CAROL)
    hello = [{"role": "user", "content": "hello"}]
    for session_id in ("one", "two"):
        chat_turns(carol, session_id, hello, 1)
    with pytest.raises(openai.RateLimitError) as refused:
        chat_turns(carol_elsewhere, "three", hello, 1)
    assert refused.value.body["code"] == "session_limit_reached"  # type: ignore[index]
    assert int(refused.value.response.headers["retry-after"]) >= 1
    chat_turns(carol_elsewhere, "one", hello, 1)  # a session it holds continues
    carol_elsewhere.chat.completions.create(model="tiny", messages=hello, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError):  # a Responses turn starts a session too
        carol.responses.create(model="tiny", input="hi", max_output_tokens=2)
    assert carol.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False).status == "incomplete"
    chat_turns(sdk(deployment.urls[1], BOB), "three", hello, 1)  # another key's sessions are its own


def test_a_key_holds_at_most_its_websockets_on_a_replica(deployment: Deployment) -> None:
    gw = deployment.apps[0].state.gateway
    url = ws_url(deployment.urls[0])
    with connect(url, additional_headers=bearer(CAROL), open_timeout=10):
        assert wait_for(lambda: gw.websockets.get("carol") == 1)
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=bearer(CAROL), open_timeout=10)
        assert refused.value.response.status_code == 403
        with connect(url, additional_headers=bearer(BOB), open_timeout=10):  # another key is not held back
            pass
    assert wait_for(lambda: "carol" not in gw.websockets)  # the slot is free again
    with connect(url, additional_headers=bearer(CAROL), open_timeout=10):
        pass
