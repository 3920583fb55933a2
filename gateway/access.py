"""Who may send a request, and how fast: API-key authentication and per-key rate limits, answered in
OpenAI's error shape (401, 429 with Retry-After)."""

from __future__ import annotations

from fastapi import Request

from gateway.auth import AuthError, Principal
from gateway.errors import APIError
from gateway.ratelimit import retry_after_header
from gateway.state import GatewayState


async def admit_principal(gw: GatewayState, authorization: str | None) -> Principal:
    try:
        principal = gw.keyring.authenticate(authorization)
    except AuthError as error:
        gw.metrics.rejected(error.code)
        raise APIError(401, error.message, error.type, None, error.code, {"WWW-Authenticate": "Bearer"}) from None
    limit = principal.rate_limit
    if limit is not None:
        decision = await gw.limiter.acquire(principal.name, limit.rate, limit.burst)
        if not decision.allowed:
            gw.metrics.rejected("rate_limit")
            raise APIError(429, f"rate limit of {limit.rate:g} requests/s exceeded for key {principal.name!r}",
                           "rate_limit_error", None, "rate_limit_exceeded",
                           {"Retry-After": retry_after_header(decision)})
    return principal


async def request_principal(request: Request) -> Principal:
    """FastAPI dependency for the API routes."""
    gw: GatewayState = request.app.state.gateway
    return await admit_principal(gw, request.headers.get("authorization"))
