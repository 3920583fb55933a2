"""`GET /admin/capacity`: the capacity controller's split, workers, alerts and recent events;
`POST /admin/capacity` pins a split by hand (`{"prefill": 1, "decode": 3}`) or releases it
(`{"unpin": true}`). Both need an admin key (`admin: true` in `api_keys`) whether or not auth is enabled:
401 without a valid key, 403 for a key that is not an admin's. A gateway without a capacity controller answers 404."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine import ServingEngine
from gateway.access import admin_principal
from gateway.api.chat import gateway_state
from gateway.auth import Principal
from gateway.errors import APIError

router = APIRouter()


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefill: int | None = Field(default=None, ge=0)
    decode: int | None = Field(default=None, ge=0)
    unpin: bool = False

    @model_validator(mode="after")
    def _one_action(self) -> PinRequest:
        pinning = self.prefill is not None or self.decode is not None
        if pinning == self.unpin or (pinning and (self.prefill is None or self.decode is None)):
            raise ValueError('send {"prefill": P, "decode": D} to pin a split, or {"unpin": true}')
        if pinning and self.prefill == self.decode == 0:
            raise ValueError("a pinned split needs at least one worker")
        return self


def _controller(engine: ServingEngine) -> None:
    if engine.capacity is None:
        raise APIError(404, "this gateway has no capacity controller (a colocated engine, or upstreams without "
                       "kv_both instances)", "invalid_request_error", None, "no_capacity_controller")


@router.get("/admin/capacity")
async def capacity(request: Request, _: Principal = Depends(admin_principal)) -> JSONResponse:
    gw = gateway_state(request)
    _controller(gw.serving_engine)
    report = await gw.engine.query(lambda engine: engine.capacity.report() if engine.capacity else {})
    return JSONResponse(report)


@router.post("/admin/capacity")
async def pin(body: PinRequest, request: Request, _: Principal = Depends(admin_principal)) -> JSONResponse:
    gw = gateway_state(request)
    _controller(gw.serving_engine)

    def apply(engine: ServingEngine) -> dict[str, Any]:
        if engine.capacity is None:
            return {}
        if body.unpin:
            engine.capacity.unpin(time.monotonic())
        else:
            engine.capacity.pin(body.prefill or 0, body.decode or 0, time.monotonic())
        return engine.capacity.report()

    return JSONResponse(await gw.engine.query(apply))
