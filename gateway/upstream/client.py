"""One streamed request to one upstream replica: OpenAI SSE chunks (chat or text completions) read into
`Delta`s. Anything that goes wrong is `UpstreamFailed` (the caller retries elsewhere or cuts the stream),
except an upstream's refusal of the request itself (4xx), which is the client's to see."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.errors import APIError
from gateway.upstream.pool import Replica

RETRYABLE_STATUSES = frozenset({408, 429})


class UpstreamFailed(Exception):
    """The replica did not answer, answered 5xx, or its stream broke."""

    def __init__(self, replica: str, message: str) -> None:
        super().__init__(f"upstream {replica}: {message}")
        self.replica = replica


@dataclass
class Delta:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's streamed fragments
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


def refusal(response: httpx.Response, body: bytes) -> APIError:
    """An upstream 4xx as the client's error, in OpenAI's shape with the upstream's message."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = error.get("message") if isinstance(error, dict) else None
    text = message or body.decode(errors="replace")[:500] or "(no message)"
    return APIError(response.status_code, f"the upstream refused the request: {text}",
                    str(error.get("type") or "invalid_request_error"), error.get("param"), error.get("code"))


def check_status(replica: Replica, response: httpx.Response, body: bytes) -> None:
    if response.status_code >= 500 or response.status_code in RETRYABLE_STATUSES:
        raise UpstreamFailed(replica.name, f"HTTP {response.status_code}: {body.decode(errors='replace')[:200]}")
    if response.status_code >= 400:
        raise refusal(response, body)


def parse_chunk(data: dict[str, Any]) -> Delta:
    delta = Delta(usage=data.get("usage"))
    for choice in data.get("choices") or []:
        message = choice.get("delta") or {}
        delta.text += str(message.get("content") or choice.get("text") or "")
        delta.tool_calls += message.get("tool_calls") or []
        delta.finish_reason = choice.get("finish_reason") or delta.finish_reason
    return delta


async def stream_deltas(client: httpx.AsyncClient, replica: Replica, path: str, body: dict[str, Any],
                        headers: dict[str, str], timeout: httpx.Timeout) -> AsyncGenerator[Delta]:
    """The stream's deltas until `[DONE]`; a stream that ends without it, or reports an error, failed."""
    try:
        async with client.stream("POST", replica.name + path, json=body, headers={**replica.headers(), **headers},
                                 timeout=timeout) as response:
            if response.status_code != 200:
                check_status(replica, response, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    return
                data = json.loads(payload)
                if "error" in data:
                    raise UpstreamFailed(replica.name, f"error in stream: {data['error']}")
                yield parse_chunk(data)
    except httpx.HTTPError as error:
        raise UpstreamFailed(replica.name, f"{type(error).__name__}: {error}") from error
    except ValueError as error:  # a chunk that is not JSON
        raise UpstreamFailed(replica.name, f"bad stream chunk: {error}") from error
    raise UpstreamFailed(replica.name, "the stream ended without [DONE]")
