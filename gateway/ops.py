"""Operational endpoints: models, health, readiness (503 while draining) and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.chat import gateway_state

router = APIRouter()
STARTED = int(time.time())


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    gw = gateway_state(request)
    model = {"id": gw.model_name, "object": "model", "created": STARTED, "owned_by": "agentserve",
             "max_model_len": gw.engine.engine.max_model_len}
    return JSONResponse({"object": "list", "data": [model]})


@router.get("/health")
async def health() -> PlainTextResponse:
    return PlainTextResponse("ok")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    gw = gateway_state(request)
    engine = gw.engine.engine
    scheduler = engine.scheduler
    gw.metrics.sync_engine(num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
                           kv_cache_usage=engine.kv.usage, kv_blocks_free=engine.kv.num_free_blocks,
                           prefix_cache_queries=engine.kv.stats.queries, prefix_cache_hits=engine.kv.stats.hits)
    gw.metrics.set_workers("colocated", 1)
    body, content_type = gw.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/ready")
async def ready(request: Request) -> PlainTextResponse:
    if gateway_state(request).draining:
        return PlainTextResponse("draining", status_code=503)
    return PlainTextResponse("ready")
