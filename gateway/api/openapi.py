"""The OpenAPI document says what the gateway answers: every error status an operation can return, with
OpenAI's error body as its schema, the event stream beside JSON where `stream: true` is accepted, and plain
text where the ops endpoints answer it. Checked against the running gateway by tests/gateway/api/test_fuzz_openapi.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from gateway.api.bodies import body_components

ERROR_SCHEMA = "ErrorResponse"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_SCHEMA}"}
ERROR_BODY = {
    "type": "object", "required": ["error"], "title": ERROR_SCHEMA,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
STATUS_MEANINGS = {
    400: "Bad request: invalid or unsupported input (the error's `param` and `code` say which)",
    401: "No API key, or an unknown one", 403: "The key may not do this (an admin key is needed)",
    404: "Unknown model, response or resource, or one of another key", 409: "The session is in a turn elsewhere",
    413: "Request body too large", 429: "Rate, session or connection limit of the key reached (Retry-After)",
    500: "The engine failed", 503: "Draining, overloaded or a dependency unavailable (Retry-After)",
}
API_ERRORS = (400, 401, 404, 409, 413, 429, 500, 503)
ERRORS = {  # "METHOD /path" -> the error statuses it may answer (every other operation: none)
    "POST /v1/chat/completions": API_ERRORS, "POST /v1/completions": API_ERRORS, "POST /v1/responses": API_ERRORS,
    "GET /v1/responses/{response_id}": (401, 404, 503),
    "GET /admin/capacity": (401, 403, 404, 503), "POST /admin/capacity": (400, 401, 403, 404, 413, 503),
}
STREAMING = ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses")
PLAIN_TEXT = {"GET /health": (200,), "GET /ready": (200, 503), "GET /metrics": (200,)}
EVENT_STREAM = {"schema": {  # one event of the stream: its `data` is a JSON chunk, or `[DONE]` last
    "type": "object", "required": ["data"], "description": "a server-sent event",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}}


def declare_errors(app: FastAPI) -> None:
    """Complete the document FastAPI builds from the routes, once, when it is first asked for."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(body_components())  # the bodies the hot routes validate themselves (gateway.api.bodies)
    schemas[ERROR_SCHEMA] = ERROR_BODY
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            label = f"{method.upper()} {path}"
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # validation errors are answered 400, in OpenAI's shape
            for status in ERRORS.get(label, ()):
                responses[str(status)] = {"description": STATUS_MEANINGS[status],
                                          "content": {"application/json": {"schema": ERROR_REF}}}
            if label in STREAMING:
                responses["200"].setdefault("content", {})["text/event-stream"] = EVENT_STREAM
            for status in PLAIN_TEXT.get(label, ()):
                responses[str(status)] = {"description": "plain text" if status == 200 else "draining",
                                          "content": {"text/plain": {"schema": {"type": "string"}}}}
    if not any("HTTPValidationError" in str(op) for ops in document["paths"].values() for op in ops.values()):
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
    return document
