"""The hot routes called past the router (`gateway.api.direct`): exactly those, the app's error handlers still
answering for them, and a non-streaming request's work run in its own task, cancelled when its client goes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Router

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.api.direct import direct_endpoint, exception_handler
from gateway.api.streaming import until_done_or_gone
from gateway.errors import APIError, ClientGone
from gateway.server.app import create_app
from gateway.settings import GatewaySettings

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(GatewaySettings(model="tiny"), LLMEngine("tiny", EngineSettings(num_kv_blocks=128)))
    with TestClient(app) as client:
        yield client


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths Starlette's router was asked for."""
    seen: list[str] = []
    original = Router.__call__

    async def counting(self: Router, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(Router, "__call__", counting)
    return seen


def test_the_hot_routes_skip_the_router_and_the_rest_take_it(client: TestClient, routed: list[str]) -> None:
    chat = client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI, "max_tokens": 2})
    completion = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    response = client.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2})
    assert [r.status_code for r in (chat, completion, response)] == [200, 200, 200]
    assert routed == []
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/chat/completions").status_code == 405  # another method: the router answers
    assert routed == ["/v1/models", "/v1/chat/completions"]


def test_errors_of_a_hot_route_come_from_the_apps_handlers(client: TestClient) -> None:
    missing = client.post("/v1/chat/completions", json={"model": "other", "messages": HI})
    invalid = client.post("/v1/chat/completions", json={"model": "tiny", "messages": "not a list"})
    not_json = client.post("/v1/responses", content=b"{", headers={"content-type": "application/json"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert invalid.status_code == 400 and invalid.json()["error"]["type"] == "invalid_request_error"
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"


def test_only_an_exact_method_and_path_outside_a_root_path_is_direct() -> None:
    async def endpoint(request: Request) -> Any:
        return None

    routes = {("POST", "/v1/chat/completions"): endpoint}
    scope = {"method": "POST", "path": "/v1/chat/completions", "root_path": ""}
    assert direct_endpoint(routes, scope) is endpoint
    assert direct_endpoint(routes, {**scope, "method": "GET"}) is None
    assert direct_endpoint(routes, {**scope, "path": "/v1/chat/completions/"}) is None
    assert direct_endpoint(routes, {**scope, "root_path": "/api"}) is None


def test_the_handler_is_picked_as_starlette_picks_it() -> None:
    class Specific(APIError):
        pass

    def handler(name: str) -> Any:
        async def handle(request: Request, error: Exception) -> Any:
            return name
        return handle

    handlers = {APIError: handler("api"), HTTPException: handler("http"), 413: handler("413"),
                Exception: handler("500")}
    picked = {name: exception_handler(handlers, error) for name, error in (
        ("subclass", Specific(400, "x")), ("status", HTTPException(413)), ("http", HTTPException(404)),
        ("other", ValueError("x")))}
    assert picked["subclass"] is handlers[APIError] and picked["status"] is handlers[413]
    assert picked["http"] is handlers[HTTPException]
    assert picked["other"] is None  # left to the server error middleware: a 500, logged


class _Receive:
    """A request whose client disconnects when `gone` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    def request(self) -> Request:
        return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, self.receive)

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def _work(started: asyncio.Event, cancelled: list[bool]) -> None:
    started.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        cancelled.append(True)
        raise


def test_a_client_gone_cancels_the_work_and_raises_client_gone() -> None:
    async def main() -> None:
        client, started, cancelled = _Receive(), asyncio.Event(), list[bool]()
        request = asyncio.create_task(until_done_or_gone(_work(started, cancelled), client.request()))
        await started.wait()
        client.gone.set()
        with pytest.raises(ClientGone):
            await request
        assert cancelled == [True] and request.cancelling() == 0

    asyncio.run(main())


def test_a_cancel_from_outside_stays_a_cancel_and_finished_work_returns() -> None:
    async def main() -> None:
        client, started, cancelled = _Receive(), asyncio.Event(), list[bool]()
        request = asyncio.create_task(until_done_or_gone(_work(started, cancelled), client.request()))
        await started.wait()
        request.cancel()  # a shutdown, not the client
        with pytest.raises(asyncio.CancelledError):
            await request
        assert cancelled == [True]
        await until_done_or_gone(asyncio.sleep(0), _Receive().request())  # done before any disconnect
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == 1  # the watcher went with it

    asyncio.run(main())
