"""Who may send a request, and how much: API-key authentication, admin keys, per-key rate limits and the
per-key limit on open WebSocket connections, answered in OpenAI's error shape (401, 403, 429 with
Retry-After)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import Request

from gateway.auth import AuthError, Principal
from gateway.errors import APIError
from gateway.ratelimit import retry_after_header
from gateway.server.state import GatewayState


def _refused(gw: GatewayState, error: AuthError) -> APIError:
    gw.metrics.rejected(error.code)
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return APIError(error.status, error.message, error.type, None, error.code, headers)


async def admit_principal(gw: GatewayState, authorization: str | None) -> Principal:
    try:
        principal = gw.keyring.authenticate(authorization)
    except AuthError as error:
        raise _refused(gw, error) from None
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


async def admin_principal(request: Request) -> Principal:
    """FastAPI dependency for the admin routes: a key marked `admin`, whether or not auth is enabled."""
    gw: GatewayState = request.app.state.gateway
    try:
        return gw.keyring.authenticate_admin(request.headers.get("authorization"))
    except AuthError as error:
        raise _refused(gw, error) from None


def prefix_cache_salt(gw: GatewayState, principal: Principal, requested: str | None) -> str | None:
    """What a request's cached prefixes are keyed under: its API key's principal (unless the deployment shares
    its prefix cache across keys; requests without a key share one cache), and within it the request's own
    `cache_salt`, so no key learns from `cached_tokens` or timing what another key sent. None: shared."""
    owner = None if gw.settings.share_prefix_cache or not principal.authenticated else principal.name
    parts = ([f"key:{owner}"] if owner is not None else []) + ([f"salt:{requested}"] if requested else [])
    return "\n".join(parts) or None


@contextmanager
def websocket_slot(gw: GatewayState, principal: Principal) -> Iterator[None]:
    """Hold one of the key's open WebSocket connections on this replica; APIError 429 when all are taken."""
    limit, open_now = principal.holds.websockets, gw.websockets.get(principal.name, 0)
    if limit is not None and open_now >= limit:
        gw.metrics.rejected("websocket_limit")
        raise APIError(429, f"key {principal.name!r} has its limit of {limit} open WebSocket connections",
                       "rate_limit_error", None, "websocket_limit_reached", {"Retry-After": "1"})
    gw.websockets[principal.name] = open_now + 1
    try:
        yield
    finally:
        gw.websockets[principal.name] -= 1
        if not gw.websockets[principal.name]:
            del gw.websockets[principal.name]
