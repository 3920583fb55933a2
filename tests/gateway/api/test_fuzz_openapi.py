"""schemathesis against the gateway's own OpenAPI document, every operation, on a real gateway (uvicorn on
loopback): valid and invalid requests, with and without an admin key; no server error, and every response
conforming to the document (a declared status, a declared content type, a body of the declared schema:
OpenAI's error body for every error). A longer run: docs/gateway.md."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_headers_conformance, response_schema_conformance

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import ADMIN, ADMIN_HEADERS, running_gateway

pytestmark = pytest.mark.slow
MAX_EXAMPLES = int(os.environ.get("AGENTSERVE_FUZZ_EXAMPLES", "300"))  # longer runs: see docs/gateway.md

CHECKS = [not_a_server_error, response_schema_conformance, response_headers_conformance]


@dataclass
class Target:
    url: str
    document: dict[str, Any]
    schema: Any  # schemathesis' loaded schema

    def declared(self, label: str) -> dict[str, Any]:
        """The responses the document declares for "METHOD /path": status -> response object."""
        method, path = label.split(" ", 1)
        return dict(self.document["paths"][path][method.lower()]["responses"])


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4, api_keys=[ADMIN])
    with running_gateway(settings, LLMEngine("tiny", EngineSettings(num_kv_blocks=1024))) as url:
        document = httpx.get(f"{url}/openapi.json", timeout=10).json()
        yield Target(url, document, schemathesis.openapi.from_dict(document))


def media_type(response: Any) -> str:
    return str(response.headers.get("content-type", [""])[0]).split(";")[0].strip()


def check_conforms(target: Target, label: str, response: Any) -> None:
    """A declared status with a declared content type (the body's schema is schemathesis' check)."""
    declared = target.declared(label)
    status = str(response.status_code)
    assert status in declared, f"{label}: undeclared {status}"
    assert media_type(response) in declared[status].get("content", {}), f"{label} {status}: {media_type(response)}"


def test_every_error_status_is_declared_with_openais_error_body(target: Target) -> None:
    error = target.document["components"]["schemas"]["ErrorResponse"]["properties"]["error"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    for label in ("POST /v1/chat/completions", "POST /v1/responses", "POST /admin/capacity"):
        errors = {status: r for status, r in target.declared(label).items() if status >= "400"}
        assert {"400", "401", "404"} <= errors.keys() and "422" not in errors, label
        for response in errors.values():
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "text/event-stream" in target.declared("POST /v1/chat/completions")["200"]["content"]
    assert "text/plain" in target.declared("GET /metrics")["200"]["content"]


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_requests_get_no_server_error_and_conforming_responses(target: Target,
                                                                          data: st.DataObject) -> None:
    mode = data.draw(st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]), label="mode")
    case = data.draw(target.schema.as_strategy(mode), label="case")
    if isinstance(case.body, dict) and "model" in case.body and data.draw(st.booleans(), label="served model"):
        case.body["model"] = "tiny"  # past the model check, into the engine
    headers = ADMIN_HEADERS if data.draw(st.booleans(), label="admin key") else None
    response = case.call(base_url=target.url, headers=headers, timeout=60)
    case.validate_response(response, checks=CHECKS, headers=headers)
    check_conforms(target, case.operation.label, response)


def test_bodies_the_routes_validate_themselves_are_declared(target: Target) -> None:
    """gateway.api.bodies: the hot routes parse their bodies without FastAPI's machinery; the document still says
    what each takes, and every reference in it resolves."""
    schemas = target.document["components"]["schemas"]
    bodies = {"POST /v1/chat/completions": "ChatCompletionRequest", "POST /v1/completions": "CompletionRequest",
              "POST /v1/responses": "ResponseCreateRequest"}
    for label, model in bodies.items():
        method, path = label.split(" ", 1)
        body = target.document["paths"][path][method.lower()]["requestBody"]
        assert body["required"] and body["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"}
    assert "messages" in schemas["ChatCompletionRequest"]["properties"]
    refs = {ref.rsplit("/", 1)[1] for ref in _refs(target.document)}
    assert refs <= schemas.keys(), refs - schemas.keys()
    headers = target.document["paths"]["/v1/chat/completions"]["post"]["parameters"]
    assert {"in": "header", "name": "x-session-id", "required": False, "schema": {"type": "string"}} in headers


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)
