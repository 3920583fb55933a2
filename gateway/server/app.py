"""The FastAPI application: the embedded engine, the session store, the routers and the ASGI guards."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine import AsyncLLMEngine, CapacitySettings, EngineSettings, LLMEngine, ServingEngine, model_sampling_defaults
from gateway import content_log
from gateway.admission import AdmissionController
from gateway.api import admin, chat, ops
from gateway.api.direct import DirectRoutes, call_direct, direct_endpoint
from gateway.api.responses import http as responses
from gateway.api.responses import ws as responses_ws
from gateway.auth import HoldLimits, KeyRing
from gateway.errors import error_body, install_error_handlers
from gateway.load_signals import LoadSignals
from gateway.metrics import Metrics
from gateway.ratelimit import open_rate_limiter
from gateway.server.state import GatewayState
from gateway.sessions.manager import SessionManager
from gateway.sessions.store import open_session_store
from gateway.settings import GatewaySettings
from gateway.upstream.engine import UpstreamEngine
from gateway.upstream.front import TokenizerFront
from gateway.upstream.masks import MaskHeaders
from gateway.upstream.metrics import UpstreamMetrics
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.request import UpstreamSessions
from trajectory.agent import Policies
from trajectory.template.default import load_chat_template


def build_engine(settings: GatewaySettings) -> ServingEngine:
    """The embedded engine, always in worker processes: one colocated worker, or prefill and decode workers when
    the config says disaggregated (in this process only with `engine_in_process`, for debugging); with
    upstreams, the model's tokenizer front only."""
    if settings.upstreams:
        return TokenizerFront(settings.model)
    if settings.engine_in_process and not settings.disaggregated:
        return LLMEngine(settings.model, EngineSettings())
    from engine import WorkerEngine, colocated_engine

    if not settings.disaggregated:
        return colocated_engine(settings.model, EngineSettings())
    return WorkerEngine(settings.model, EngineSettings(), capacity=CapacitySettings())


def build_state(settings: GatewaySettings, engine: ServingEngine) -> GatewayState:
    if engine.tokenizer is None:
        raise ValueError(f"model {settings.model} has no tokenizer; the gateway needs one to serve chat")
    template = load_chat_template(engine.checkpoint)
    store = open_session_store(settings.redis_url)
    metrics = Metrics()
    async_engine = serving_engine(settings, engine, metrics)
    manager = UpstreamSessions if isinstance(async_engine, UpstreamEngine) else SessionManager
    sessions = manager(store, template, engine.tokenizer, Policies.load(), settings.session_ttl_s)
    limits = settings.limits
    admission = AdmissionController(limits.ttft_slo_s, limits.initial_prefill_tokens_per_s,
                                    tpot_slo_s=limits.tpot_slo_s, slo_context_tokens=engine.max_model_len)
    signals = load_signals(settings, async_engine)
    signals.watch(admission)  # the admitted work is the capacity controller's demand
    holds = HoldLimits(limits.max_sessions_per_key, limits.max_websockets_per_key)
    return GatewayState(settings, async_engine, engine.tokenizer, sessions,
                        KeyRing.from_config(settings.api_keys, settings.auth_enabled, holds),
                        open_rate_limiter(settings.redis_url), admission, metrics, signals,
                        model_sampling_defaults(settings.model, engine.checkpoint))


def serving_engine(settings: GatewaySettings, engine: ServingEngine, metrics: Metrics) -> AsyncLLMEngine:
    """The engine seam of `gateway.api.generation`: the embedded engine's, or the upstream pool's."""
    if not isinstance(engine, TokenizerFront):
        return AsyncLLMEngine(engine)
    pool = UpstreamPool(settings.upstreams, settings.upstream)
    return UpstreamEngine(engine, pool, UpstreamMetrics(metrics.registry), settings.model_name)


def load_signals(settings: GatewaySettings, engine: AsyncLLMEngine) -> LoadSignals:
    """The forecaster is loaded only where a capacity controller reads it (a disaggregated engine, or
    upstream instances whose roles the controller splits)."""
    forecaster = None
    if engine.engine.capacity is not None:
        from predictor.forecast import LoadForecaster  # torch model: only when used

        forecaster = LoadForecaster(Path(settings.predictor_model) if settings.predictor_model else None,
                                    expire_s=settings.session_ttl_s)
    recording = Path(settings.record_sessions) if settings.record_sessions else None
    capacity = CapacitySettings()
    return LoadSignals(engine, capacity.interval_s, capacity.forecast_horizon_s, forecaster, recording,
                       session_ttl_s=settings.session_ttl_s)


def create_app(settings: GatewaySettings | None = None, engine: ServingEngine | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    content_log.configure(settings.log_content)
    state = build_state(settings, engine or build_engine(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        state.signals.start()
        try:
            yield
        finally:
            await state.signals.stop()
            if isinstance(state.engine, UpstreamEngine):
                await state.engine.close()
            state.engine.shutdown()
            await state.sessions.store.close()
            await state.limiter.close()

    app = FastAPI(title="agentserve", lifespan=lifespan)
    app.state.gateway = state
    install_error_handlers(app)
    for router in (chat.router, ops.router, responses.router, responses_ws.router, admin.router):
        app.include_router(router)
    app.add_middleware(Guard, state=state, direct={("POST", "/v1/chat/completions"): chat.chat_completions,
                                                   ("POST", "/v1/completions"): chat.completions,
                                                   ("POST", "/v1/responses"): responses.create_response})
    if isinstance(state.engine, UpstreamEngine):
        app.add_middleware(MaskHeaders)
    return app


class Guard:
    """Pure ASGI middleware: refuses bodies over the limit (413) and new work while draining (503), and
    counts in-flight API requests until their last byte is sent (streams included), for the drain. The hot
    routes in `direct` are called from here, past the router (`gateway.api.direct`)."""

    def __init__(self, app: ASGIApp, state: GatewayState, direct: DirectRoutes | None = None) -> None:
        self.app, self.state, self.direct = app, state, direct or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.state.draining:
            await _reply(send, 503, error_body("the gateway is draining", "service_unavailable", None, "draining"),
                         {"retry-after": "1"})
            return
        limit = self.state.settings.limits.max_body_bytes
        if _declared_length(scope) > limit:
            await _reply(send, 413, _too_large(limit))
            return
        self.state.in_flight += 1
        endpoint = direct_endpoint(self.direct, scope)
        try:
            if endpoint is None:
                await self.app(scope, _limited(receive, limit), send)
            else:
                await call_direct(endpoint, scope, _limited(receive, limit), send)
        except BodyTooLarge:
            await _reply(send, 413, _too_large(limit))
        finally:
            self.state.in_flight -= 1


class BodyTooLarge(StarletteHTTPException):
    """An HTTPException, so that FastAPI re-raises it from its body parsing instead of answering 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes")


def _too_large(limit: int) -> dict[str, Any]:
    return error_body(BodyTooLarge(limit).detail, "invalid_request_error", None, "request_too_large")


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


def _limited(receive: Receive, limit: int) -> Receive:
    """Counts body bytes as they arrive (a chunked body declares no length)."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise BodyTooLarge(limit)
        return message

    return wrapped


async def _reply(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
