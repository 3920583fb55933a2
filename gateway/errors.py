"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import EngineDeadError, RequestError
from gateway.api.openapi import declare_errors
from trajectory.template.types import ChatTemplateError


class ClientGone(Exception):
    """The client closed the connection before a non-streaming response was ready."""


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


STORE_ERRORS = (RedisConnectionError, RedisTimeoutError)  # the session store (Redis) unreachable


def store_unavailable(error: Exception) -> APIError:
    """Sessions, records and rate limits live in the store: without it a turn is 503, retried after a second."""
    return APIError(503, f"the session store is unavailable: {error}", "service_unavailable_error",
                    code="session_store_unavailable", headers={"Retry-After": "1"})


def from_request_error(error: RequestError) -> APIError:
    message = str(error)
    code = "context_length_exceeded" if "context" in message or "KV blocks" in message else None
    return APIError(400, message, code=code)


CODED_ERRORS = {"extra_forbidden": "unsupported_parameter", "unsupported_parameter": "unsupported_parameter",
                "unsupported_content": "unsupported_content", "empty_input": "empty_input"}  # error type -> code


def validation_error(errors: Sequence[Any], code: str | None = None) -> APIError:
    """A 400 for the first of pydantic's errors, naming its parameter; `code` unless the error has its own."""
    first = errors[0] if errors else {}
    param = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
    kind = first.get("type")
    if kind == "json_invalid":
        return APIError(400, "request body is not valid JSON", code=code)
    if kind == "extra_forbidden":
        return APIError(400, f"{param}: unsupported parameter; agentserve does not implement it", param=param,
                        code=CODED_ERRORS[kind])
    return APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid value')}", param=param,
                    code=CODED_ERRORS.get(str(kind), code))


def install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, each status declared in the OpenAPI document (gateway/api/openapi.py)."""
    declare_errors(app)

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, error: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request", for the logs

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        api = validation_error(error.errors())
        return JSONResponse(api.body(), status_code=api.status)

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, error: RequestError) -> JSONResponse:
        api = from_request_error(error)
        return JSONResponse(api.body(), status_code=api.status)

    @app.exception_handler(ChatTemplateError)
    async def bad_template(_: Request, error: ChatTemplateError) -> JSONResponse:
        return JSONResponse(error_body(str(error), "invalid_request_error", "messages"), status_code=400)

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def store_down(_: Request, error: Exception) -> JSONResponse:
        api = store_unavailable(error)
        return JSONResponse(api.body(), status_code=api.status, headers=api.headers)

    @app.exception_handler(EngineDeadError)
    async def engine_down(_: Request, error: EngineDeadError) -> JSONResponse:
        body = error_body(f"the engine is unavailable: {error}", "service_unavailable_error", code="engine_unavailable")
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(Exception)
    async def internal(_: Request, error: Exception) -> JSONResponse:  # logged by the server as well
        return JSONResponse(error_body("internal server error", "internal_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if error.status_code == 413 else None
        return JSONResponse(error_body(str(error.detail), type_, None, code), status_code=error.status_code,
                            headers=error.headers)
