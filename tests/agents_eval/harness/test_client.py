"""The harness's WebSocket session on raw events: a turn's reply and usage, the same logical content as the chat
client (tools with every request, tool message names), and each way a turn fails."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from agents_eval.harness.client import RequestFailed, WsSession

TOOL = {"type": "function", "function": {"name": "bash", "description": "Run a bash action.",
                                         "parameters": {"type": "object", "properties": {}}}}


@dataclass(frozen=True)
class Turn:
    new_messages: tuple[dict[str, str], ...]
    max_output_tokens: int = 4
    history: str = "append"
    tools: tuple[dict[str, Any], ...] = ()


@dataclass
class ScriptedConnection:
    """What `send_raw` and `recv_bytes` of the SDK's connection do, with the server's events scripted."""

    events: list[dict[str, Any] | None]  # None: the connection closes there
    sent: list[dict[str, Any]] = field(default_factory=list)

    async def send_raw(self, data: str) -> None:
        self.sent.append(json.loads(data))

    async def recv_bytes(self) -> bytes:
        event = self.events.pop(0)
        if event is None:
            raise ConnectionClosedError(Close(1011, "gone"), None)
        return json.dumps(event).encode()


def completed(response_id: str) -> dict[str, Any]:
    usage = {"input_tokens": 12, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 8}}
    return {"type": "response.completed", "response": {"id": response_id, "usage": usage}}


def test_a_turn_reads_its_deltas_and_usage_and_the_next_continues_from_its_response() -> None:
    deltas = [{"type": "response.output_text.delta", "delta": text} for text in ("he", "y")]
    connection = ScriptedConnection([{"type": "response.created"}, *deltas, completed("resp_1"), completed("resp_2")])
    session = WsSession(connection, "tiny", "be brief")
    reply = asyncio.run(session.send(Turn(({"role": "user", "content": "hi"},))))
    assert (reply.text, reply.prompt_tokens, reply.cached_tokens, reply.output_tokens) == ("hey", 12, 8, 2)
    assert reply.ttft_s is not None and reply.ttft_s <= reply.e2e_s
    assert connection.sent[0]["instructions"] == "be brief" and "previous_response_id" not in connection.sent[0]
    assert reply.token_times_s[0] == reply.ttft_s and len(reply.token_times_s) == 2
    tool = {"role": "tool", "tool_call_id": "call_1", "name": "bash", "content": "ok"}
    asyncio.run(session.send(Turn((tool,), tools=(TOOL,))))
    assert connection.sent[1]["previous_response_id"] == "resp_1"
    assert connection.sent[1]["input"] == [{"type": "function_call_output", "call_id": "call_1", "output": "ok",
                                            "name": "bash"}]
    assert connection.sent[1]["tools"] == [{"type": "function", **TOOL["function"]}]  # with every request


@pytest.mark.parametrize(("event", "message"), [
    ({"type": "error", "error": {"message": "too long"}}, "error: {'message': 'too long'}"),
    ({"type": "response.failed", "response": {"error": {"code": "server_error"}}}, "response.failed: "),
    (None, "the WebSocket closed during a turn"),
])
def test_a_failed_turn_raises_request_failed(event: dict[str, Any] | None, message: str) -> None:
    connection = ScriptedConnection([{"type": "response.output_text.delta", "delta": "a"}, event])
    with pytest.raises(RequestFailed, match=re.escape(message)):
        asyncio.run(WsSession(connection, "tiny", "").send(Turn(({"role": "user", "content": "hi"},))))
