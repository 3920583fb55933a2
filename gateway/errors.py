"""Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.sampling import RequestError
from trajectory.template_types import ChatTemplateError


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


def from_request_error(error: RequestError) -> APIError:
    message = str(error)
    code = "context_length_exceeded" if "context" in message or "KV blocks" in message else None
    return APIError(400, message, code=code)


def _validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    first = error.errors()[0] if error.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "json_invalid":
        return "request body is not valid JSON", None
    return f"{param or 'body'}: {first.get('msg', 'invalid value')}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(_: Request, error: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it: nginx's "client closed request", for the logs

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(error)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, error: RequestError) -> JSONResponse:
        api = from_request_error(error)
        return JSONResponse(api.body(), status_code=api.status)

    @app.exception_handler(ChatTemplateError)
    async def bad_template(_: Request, error: ChatTemplateError) -> JSONResponse:
        return JSONResponse(error_body(str(error), "invalid_request_error", "messages"), status_code=400)

    @app.exception_handler(Exception)
    async def internal(_: Request, error: Exception) -> JSONResponse:  # logged by the server as well
        return JSONResponse(error_body("internal server error", "internal_error"), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if error.status_code == 413 else None
        return JSONResponse(error_body(str(error.detail), type_, None, code), status_code=error.status_code,
                            headers=error.headers)
