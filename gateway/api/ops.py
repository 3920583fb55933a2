"""Operational endpoints: models, health, readiness (503 while draining) and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.api.chat import gateway_state

router = APIRouter()
STARTED = int(time.time())


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    gw = gateway_state(request)
    model = {"id": gw.model_name, "object": "model", "created": STARTED, "owned_by": "agentserve",
             "max_model_len": gw.serving_engine.max_model_len}
    return JSONResponse({"object": "list", "data": [model]})


@router.get("/health")
async def health() -> PlainTextResponse:
    return PlainTextResponse("ok")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    gw = gateway_state(request)
    gw.metrics.sync_engine(gw.serving_engine.stats())
    gw.metrics.sync_workers(gw.serving_engine.worker_reports())
    gw.metrics.sync_signals(*gw.signals.forecaster_in_use(), gw.signals.failures)
    gw.metrics.sync_kv_tiers(gw.serving_engine.kv_tier_stats())
    gw.metrics.set_sessions(await gw.sessions.store.count())
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/ready")
async def ready(request: Request) -> PlainTextResponse:
    if gateway_state(request).draining:
        return PlainTextResponse("draining", status_code=503)
    return PlainTextResponse("ready")
