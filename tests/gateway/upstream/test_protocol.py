"""The upstream seam against fake OpenAI servers on loopback that record what they receive: vLLM's prefill/
decode request sequence field by field, Responses (HTTP and WebSocket) over a chat-only upstream, failover
before the first token, a stream cut mid-way, and the masks that cannot apply upstream."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types.chat import ChatCompletionMessageParam
from websockets.sync.client import connect

from gateway.auth import ANONYMOUS
from gateway.sessions.store import session_key
from gateway.settings import GatewaySettings
from gateway.upstream.hashing import BoundedLoadRing
from gateway.upstream.pd import PREFILL_KV_TRANSFER_PARAMS
from gateway.upstream.pool import role_split
from gateway.upstream.settings import UpstreamPoolSettings, UpstreamSpec
from tests.conftest import free_port
from tests.gateway.conftest import running_gateway, serving

MODEL = "fake-model"
REPLY = ["Hello", " from", " upstream"]
KV_FROM_PREFILL = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "engine-p0",
                   "remote_block_ids": [3, 4, 5], "remote_host": "10.1.2.3", "remote_port": 5600,
                   "remote_request_id": "p-req", "tp_size": 1}


@dataclass
class Fake:
    """An OpenAI server that speaks chat completions and nothing else of the Responses API."""

    name: str
    mode: str = "ok"  # ok | fail (HTTP 500) | cut (one chunk, then the connection drops)
    seen: list[dict[str, Any]] = field(default_factory=list)
    gate: threading.Event | None = None  # when set: a prefill leg waits for it (at most 30 s) before answering

    def app(self) -> FastAPI:
        app = FastAPI()
        app.get("/ready")(lambda: "ready")
        app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.seen.append({"path": request.url.path, "body": body,
                              "request_id": request.headers.get("x-request-id"),
                              "session_id": request.headers.get("x-session-id")})
            if self.mode == "fail":
                return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
            if not body.get("stream"):  # vLLM's prefill leg
                if self.gate is not None:
                    await asyncio.to_thread(self.gate.wait, 30)
                return {"id": "p", "object": "chat.completion", "model": MODEL, "kv_transfer_params": KV_FROM_PREFILL,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                     "finish_reason": "length"}]}
            return StreamingResponse(self._chunks(), media_type="text/event-stream")

        return app

    async def _chunks(self) -> AsyncIterator[str]:
        def chunk(**choice: Any) -> str:
            return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                                          "choices": [{"index": 0, **choice}]}) + "\n\n"

        yield chunk(delta={"role": "assistant", "content": ""}, finish_reason=None)
        for piece in REPLY:
            yield chunk(delta={"content": piece}, finish_reason=None)
            if self.mode == "cut":
                raise ConnectionResetError("the upstream went away")  # uvicorn drops the connection
        yield chunk(delta={}, finish_reason="stop")
        usage = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
                 "prompt_tokens_details": {"cached_tokens": 32}}
        last = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        yield "data: " + json.dumps(last) + "\n\n"
        yield "data: [DONE]\n\n"


@pytest.fixture
def fakes() -> Iterator[dict[str, tuple[Fake, str]]]:
    """Four fakes: a vLLM prefill and decode instance, a chat-only server, one that answers 500."""
    made = {name: Fake(name, mode="fail" if name == "failing" else "ok")
            for name in ("prefill", "decode", "chat", "failing")}
    with serving(made["prefill"].app(), free_port()) as p, serving(made["decode"].app(), free_port()) as d, \
            serving(made["chat"].app(), free_port()) as c, serving(made["failing"].app(), free_port()) as f:
        yield {"prefill": (made["prefill"], p), "decode": (made["decode"], d), "chat": (made["chat"], c),
               "failing": (made["failing"], f)}


def front(upstreams: list[Any], **pool: Any) -> Any:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=16, upstreams=upstreams,
                               upstream=UpstreamPoolSettings(**pool))
    return running_gateway(settings)


def test_vllm_prefill_then_decode_legs_carry_kv_transfer_params(fakes: dict[str, tuple[Fake, str]]) -> None:
    prefill, p_url = fakes["prefill"]
    decode, d_url = fakes["decode"]
    upstreams = [{"url": p_url + "/v1", "kv_role": "kv_producer"}, {"url": d_url + "/v1", "kv_role": "kv_consumer"}]
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Say hello."}]
    with front(upstreams) as url, openai.OpenAI(base_url=url + "/v1", api_key="none") as client:
        stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0.5,
                                                stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(REPLY)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 32
    assert [s["path"] for s in prefill.seen] == ["/v1/chat/completions"]
    assert [s["path"] for s in decode.seen] == ["/v1/chat/completions"]
    p_body, d_body = prefill.seen[0]["body"], decode.seen[0]["body"]
    # the prefill leg: not streamed, one token, do_remote_decode, nothing remote yet, no stream_options
    assert p_body["kv_transfer_params"] == PREFILL_KV_TRANSFER_PARAMS
    assert p_body["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                            "remote_engine_id": None, "remote_block_ids": None,
                                            "remote_host": None, "remote_port": None}
    assert p_body["stream"] is False and p_body["max_tokens"] == 1
    assert "stream_options" not in p_body and "min_tokens" not in p_body
    # the decode leg: the client's request, streamed, with exactly what the prefill instance returned
    assert d_body["kv_transfer_params"] == KV_FROM_PREFILL
    assert d_body["stream"] is True and d_body["max_tokens"] == 12 and d_body["temperature"] == 0.5
    assert d_body["stream_options"] == {"include_usage": True}
    assert p_body["messages"] == d_body["messages"] == messages
    assert p_body["model"] == d_body["model"] == MODEL
    assert prefill.seen[0]["request_id"] == decode.seen[0]["request_id"] is not None


def test_a_saved_sessions_id_goes_upstream_on_both_legs(fakes: dict[str, tuple[Fake, str]]) -> None:
    prefill, p_url = fakes["prefill"]
    decode, d_url = fakes["decode"]
    upstreams = [{"url": p_url + "/v1", "kv_role": "kv_producer"}, {"url": d_url + "/v1", "kv_role": "kv_consumer"}]
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with front(upstreams) as url:
        saved = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": "s-7"}, json=ask, timeout=30)
        throwaway = httpx.post(url + "/v1/chat/completions", json=ask, timeout=30)
    assert saved.status_code == throwaway.status_code == 200, (saved.text, throwaway.text)
    namespaced = session_key(ANONYMOUS, "s-7").path  # another API key's "s-7" is another session upstream too
    assert [s["session_id"] for s in prefill.seen] == [namespaced, None]
    assert [s["session_id"] for s in decode.seen] == [namespaced, None]


def test_responses_http_and_websocket_over_a_chat_only_upstream(fakes: dict[str, tuple[Fake, str]]) -> None:
    chat, c_url = fakes["chat"]
    with front([c_url + "/v1"]) as url, openai.OpenAI(base_url=url + "/v1", api_key="none") as client:
        first = client.responses.create(model="tiny", input="Say hello.", instructions="Be brief.")
        second = client.responses.create(model="tiny", input="Again.", previous_response_id=first.id)
        with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
            assert ws.response is not None and ws.response.headers["x-agentserve-masks"] == "unavailable-upstream"
            ws.send(json.dumps({"type": "response.create", "model": "tiny", "input": "Over the socket."}))
            events: list[dict[str, Any]] = []
            while not events or events[-1]["type"] not in ("response.completed", "response.failed", "error"):
                events.append(json.loads(ws.recv(timeout=30)))
    assert first.output_text == second.output_text == "".join(REPLY)
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "".join(REPLY)
    assert {s["path"] for s in chat.seen} == {"/v1/chat/completions"}
    # the second turn sent the session's history: the first turn, its reply, the new input
    history = chat.seen[1]["body"]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert history[2]["content"] == "".join(REPLY) and history[3]["content"] == "Again."


def session_homed_on(ring_names: list[str], home: str) -> str:
    """A session id whose key (the anonymous principal's) hashes to `home` first."""
    ring = BoundedLoadRing(ring_names, UpstreamPoolSettings().virtual_nodes, 1.25)
    return next(f"s{i}" for i in range(10_000) if ring.walk(session_key(ANONYMOUS, f"s{i}").path)[0] == home)


def test_a_replica_failing_before_its_first_token_is_retried_on_another(fakes: dict[str, tuple[Fake, str]]) -> None:
    failing, f_url = fakes["failing"]
    chat, c_url = fakes["chat"]
    names = [f_url + "/v1", c_url + "/v1"]
    session = session_homed_on(names, names[0])
    with front(names) as url:
        reply = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": session}, timeout=30,
                           json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        metrics = httpx.get(url + "/metrics").text
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "".join(REPLY)
    assert len(failing.seen) == 1 and len(chat.seen) == 1
    assert "agentserve:upstream_failovers_total 1.0" in metrics
    assert f'agentserve:upstream_requests_total{{outcome="failed",upstream="{names[0]}"}} 1.0' in metrics


def test_every_replica_failing_is_an_openai_shaped_502_and_none_healthy_a_503() -> None:
    failing = Fake("failing", mode="fail")
    with serving(failing.app(), free_port()) as f_url, front([f_url + "/v1"], health_interval_s=3600) as url:
        reply = httpx.post(url + "/v1/chat/completions", timeout=30,
                           json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 502
        assert reply.json()["error"]["code"] == "upstream_failed"
        again = httpx.post(url + "/v1/chat/completions", timeout=30,  # the failed replica is now marked down
                           json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert again.status_code == 503 and again.headers["retry-after"] == "3600"
    assert set(again.json()["error"]) == {"message", "type", "param", "code"}
    assert again.json()["error"]["code"] == "upstream_unavailable"


def test_a_stream_cut_mid_way_ends_with_an_error_event() -> None:
    cutting = Fake("cut", mode="cut")
    with serving(cutting.app(), free_port()) as c_url, front([c_url + "/v1"]) as url:
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=30,
                          json={"model": "tiny", "stream": True,
                                "messages": [{"role": "user", "content": "hi"}]}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data:")]
        metrics = httpx.get(url + "/metrics").text
    payloads = [line[len("data: "):] for line in lines]
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[1])["choices"][0]["delta"]["content"] == REPLY[0]
    error = json.loads(payloads[-2])["error"]
    assert "broke off" in error["message"]
    assert 'outcome="cut"' in metrics


def test_masks_that_cannot_apply_upstream_are_reported(fakes: dict[str, tuple[Fake, str]]) -> None:
    _, c_url = fakes["chat"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the file."}]
    for i in range(3):  # three observations: the oldest falls out of the last two kept, so it is masked
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": f"file_{i}.txt and more text here"}]
    with front([c_url + "/v1"]) as url:
        reply = httpx.post(url + "/v1/chat/completions", timeout=30, json={"model": "tiny", "messages": messages})
        metrics = httpx.get(url + "/metrics").text
    assert reply.status_code == 200, reply.text
    unapplied = int(reply.headers["x-agentserve-masks-unapplied"])
    assert unapplied > 0
    assert f"agentserve:upstream_unapplied_masked_tokens_total {float(unapplied)}" in metrics
    assert "agentserve:masked_tokens_total 0.0" in metrics


def test_the_ring_keeps_keys_home_moves_only_a_removed_replicas_keys_and_bounds_loads() -> None:
    names = ["http://a/v1", "http://b/v1", "http://c/v1"]
    ring, smaller = BoundedLoadRing(names, 64, 1.25), BoundedLoadRing(names[:2], 64, 1.25)
    keys = [f"session-{i}" for i in range(300)]
    homes = {key: ring.pick(key, {}, set(names)) for key in keys}
    assert {homes[key] for key in keys} == set(names)  # every replica is someone's home
    assert all(ring.pick(key, {}, set(names)) == homes[key] for key in keys)  # stable
    moved = [key for key in keys if smaller.pick(key, {}, set(names[:2])) != homes[key]]
    assert moved and all(homes[key] == names[2] for key in moved)  # only the removed replica's sessions move
    key = keys[0]
    home, second = ring.walk(key)[:2]
    loads = {home: 5, second: 0}  # bound: ceil(1.25 x 6 / 3) = 3, which home exceeds
    assert ring.pick(key, loads, set(names)) == second
    even = dict.fromkeys(names, 1)  # bound: ceil(1.25 x 4 / 3) = 2, which nobody reaches
    assert ring.pick(key, even, set(names)) == home


def test_kv_both_instances_split_by_the_prefill_share() -> None:
    specs = [UpstreamSpec(url=f"http://p{i}/v1", kv_role="kv_both") for i in range(4)]
    roles = role_split([*specs, UpstreamSpec(url="http://d/v1", kv_role="kv_consumer")], 0.25)
    assert sorted(roles.values()) == ["decode", "decode", "decode", "decode", "prefill"]
    assert list(role_split(specs[:2], 1.0).values()) == ["prefill", "decode"]  # one of each at least
