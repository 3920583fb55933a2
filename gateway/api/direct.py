"""The hot API routes (chat, completions, responses), called straight from the gateway's outer middleware.

FastAPI still declares them (the OpenAPI document, the router for anything the table does not match exactly),
but a request to one of them skips Starlette's exception middleware, the router's scan of every route and
FastAPI's per-request wrapper (two `AsyncExitStack`s, the exception wrapper): about 75 µs of the event loop's
time per request at concurrency 1, where the gateway's own time is about 1 ms (`bench gateway`; the layers
run cache-cold after each wait for the engine). The endpoints take the `Request` and return a `Response`
with no FastAPI dependencies, so the two ways in run the same code; an error an endpoint raises is answered
by the app's own exception handler for its class, and anything without one (a 500) goes on up to Starlette's
`ServerErrorMiddleware`, as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Exception], Awaitable[Response]]
DirectRoutes = Mapping[tuple[str, str], Endpoint]  # (method, path) -> endpoint


def direct_endpoint(routes: DirectRoutes, scope: Scope) -> Endpoint | None:
    """The endpoint for exactly this method and path; None (the router decides) for anything else, or under
    a root path."""
    if scope.get("root_path"):
        return None
    return routes.get((scope["method"], scope["path"]))


async def call_direct(endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
    request = Request(scope, receive, send)
    try:
        response = await endpoint(request)
    except Exception as error:
        handler = exception_handler(scope["app"].exception_handlers, error)
        if handler is None:
            raise
        response = await handler(request, error)
    await response(scope, receive, send)


def exception_handler(handlers: Mapping[Any, Handler], error: Exception) -> Handler | None:
    """The app's handler for this error as Starlette's exception middleware picks it (an HTTPException's status
    first, then the nearest class), leaving `Exception` itself to the server error middleware."""
    if isinstance(error, HTTPException) and error.status_code in handlers:
        return handlers[error.status_code]
    for cls in type(error).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
