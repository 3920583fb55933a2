"""Request bodies of the hot routes, validated by pydantic-core straight from the bytes.

FastAPI's own body handling (JSON decoding to Python objects, then dependency solving and validation of
the decoded dict) took about 60 µs more per request than `model_validate_json` on the raw body, and the
gateway's event loop pays it once per request: at concurrency 64 the 64th request waits for all the others.
Errors keep their shape: a `RequestValidationError` whose locations lack FastAPI's leading "body" (which
`gateway.errors.validation_error` drops anyway), answered 400 in OpenAI's error shape. The OpenAPI document
still declares each body: `body_openapi` gives the route's `openapi_extra`, and `gateway.api.openapi` moves the
model's nested schemas into the document's components.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

SCHEMA_REF = "#/components/schemas/{model}"
BODY_SCHEMAS: dict[str, type[BaseModel]] = {}  # model name -> model, for gateway.api.openapi's components
M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        if not any(e["type"] == "json_invalid" for e in error.errors()):
            raise RequestValidationError(error.errors(include_url=False)) from None
    return _lenient(body, model)


def _lenient(body: bytes, model: type[M]) -> M:
    """What pydantic's strict JSON parser refused (a lone surrogate escape, which Python's json takes and the
    tokenizer later replaces), through the standard library's parser; still 400 for what is not JSON."""
    try:
        return model.model_validate(json.loads(body))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError and pydantic's ValidationError alike
        errors = error.errors(include_url=False) if isinstance(error, ValidationError) else [
            {"type": "json_invalid", "loc": (), "msg": str(error), "input": body}]
        raise RequestValidationError(errors) from None


def body_openapi(model: type[BaseModel], optional_headers: tuple[str, ...] = ()) -> dict[str, Any]:
    """A route's `openapi_extra` declaring `model` as its required JSON body, and the optional string headers
    the route reads."""
    BODY_SCHEMAS[model.__name__] = model
    ref = {"$ref": SCHEMA_REF.format(model=model.__name__)}
    extra: dict[str, Any] = {"requestBody": {"content": {"application/json": {"schema": ref}}, "required": True}}
    if optional_headers:
        extra["parameters"] = [{"in": "header", "name": name, "required": False, "schema": {"type": "string"}}
                               for name in optional_headers]
    return extra


def body_components() -> dict[str, Any]:
    """The schemas of every declared body and of the models nested in them, by name."""
    schemas: dict[str, Any] = {}
    for name, model in BODY_SCHEMAS.items():
        schema = model.model_json_schema(ref_template=SCHEMA_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    return schemas
