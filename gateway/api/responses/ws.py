"""`GET /v1/responses` upgraded to a WebSocket: OpenAI's Responses WebSocket mode, plus agentserve's tool-call
announcements (`session.tool_call.started` / `.finished`), which re-time the session's KV pin.

Frames are read all the time and answered at once when bad; the events they carry run one at a time, in
order, on a worker task. A client that leaves mid-turn cancels the worker, which closes the engine's
stream and so aborts the request. A connection holds one agent session: the one its latest response
belongs to. See docs/gateway.md for the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from engine import RequestError
from gateway.access import admit_principal, websocket_slot
from gateway.api.chat import check_model
from gateway.api.responses.http import SessionTarget, resolve_session, response_events
from gateway.api.responses.input import ResponseCreateRequest
from gateway.errors import STORE_ERRORS, APIError, from_request_error, store_unavailable, validation_error
from gateway.server.state import GatewayState
from gateway.settings import LimitSettings
from trajectory.json_codec import dumps
from trajectory.template.types import ChatTemplateError

router = APIRouter()
log = logging.getLogger(__name__)
MAX_QUEUED_EVENTS = 64
CLOSE_NORMAL, CLOSE_POLICY_VIOLATION, CLOSE_TRY_AGAIN = 1000, 1008, 1013
INVALID_JSON = object()
ENVELOPE = ("type", "event_id", "stream_id")  # fields of every client event, not of its body


class ToolCallStarted(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    estimated_duration_s: float | None = Field(default=None, ge=0)


class ToolCallFinished(BaseModel):
    model_config = ConfigDict(extra="forbid")


EVENT_BODIES: dict[str, type[BaseModel]] = {
    "response.create": ResponseCreateRequest,
    "session.tool_call.started": ToolCallStarted,
    "session.tool_call.finished": ToolCallFinished,
}


@dataclass
class ClientEvent:
    body: BaseModel
    event_id: str | None = None
    stream_id: str | None = None


def uvicorn_websocket_options(limits: LimitSettings) -> dict[str, Any]:
    """uvicorn.Config keywords for this mode: protocol pings every `ws_ping_interval_s`, and a frame cap above
    `max_ws_message_bytes`, so a message over the limit gets an `error` event instead of a closed socket."""
    return {"ws_ping_interval": limits.ws_ping_interval_s, "ws_ping_timeout": limits.ws_ping_interval_s,
            "ws_max_size": 2 * limits.max_ws_message_bytes}


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    gw: GatewayState = websocket.app.state.gateway
    if gw.draining:
        await websocket.close(CLOSE_TRY_AGAIN, "the gateway is draining")
        return
    try:
        principal = await admit_principal(gw, websocket.headers.get("authorization"))
        with websocket_slot(gw, principal):
            await websocket.accept()
            await ResponsesConnection(gw, websocket).serve()
    except APIError as error:  # refused at the handshake: the client sees HTTP 403
        await websocket.close(CLOSE_POLICY_VIOLATION, error.message)
    except STORE_ERRORS as error:  # the key's rate limit lives in the store
        await websocket.close(CLOSE_TRY_AGAIN, store_unavailable(error).message[:120])


class ResponsesConnection:
    def __init__(self, gw: GatewayState, websocket: WebSocket) -> None:
        self.gw, self.websocket = gw, websocket
        self.limits = gw.settings.limits
        self.queue: asyncio.Queue[ClientEvent] = asyncio.Queue(MAX_QUEUED_EVENTS)
        self.session: SessionTarget | None = None  # the session of the latest response
        self._send_lock = asyncio.Lock()

    async def serve(self) -> None:
        """Until the client leaves or the connection reaches its maximum age."""
        tasks = {asyncio.create_task(self._read()), asyncio.create_task(self._work())}
        try:
            done, _ = await asyncio.wait(tasks, timeout=self.limits.ws_max_connection_age_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, Exception) and not isinstance(result, WebSocketDisconnect):
                    log.error("responses websocket failed", exc_info=result)
        if not done:
            await self._close_for_age()

    async def _close_for_age(self) -> None:
        error = APIError(400, f"the connection reached its maximum age of {self.limits.ws_max_connection_age_s}s; "
                              "open a new one and continue with previous_response_id",
                         code="websocket_connection_limit_reached")
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await self.send_error(error, None)
            await self.websocket.close(CLOSE_NORMAL, "connection age limit reached")

    async def _read(self) -> None:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("text")
            frame = frame if frame is not None else message.get("bytes") or b""
            await self._on_frame(frame)

    async def _on_frame(self, frame: str | bytes) -> None:
        data = _decode(frame)
        event_id = data.get("event_id") if isinstance(data, dict) else None
        event_id = event_id if isinstance(event_id, str) else None
        try:
            self._check_size(frame)
            self.queue.put_nowait(parse_event(data))
        except APIError as error:
            await self.send_error(error, event_id)
        except asyncio.QueueFull:
            await self.send_error(APIError(429, f"more than {MAX_QUEUED_EVENTS} events are waiting on this "
                                                "connection", "rate_limit_error", code="websocket_queue_full"),
                                  event_id)

    def _check_size(self, frame: str | bytes) -> None:
        size = len(frame.encode()) if isinstance(frame, str) else len(frame)
        limit = self.limits.max_ws_message_bytes
        if size > limit:
            raise APIError(400, f"the message has {size} bytes; the limit is {limit}", code="message_too_large")

    async def _work(self) -> None:
        while True:
            event = await self.queue.get()
            try:
                await self._handle(event)
            except WebSocketDisconnect:
                raise
            except Exception as error:  # reported to the client as an error event; the connection stays
                await self.send_error(as_api_error(error), event.event_id, event.stream_id)

    async def _handle(self, event: ClientEvent) -> None:
        if isinstance(event.body, ResponseCreateRequest):
            await self._respond(event, event.body)
        else:
            await self._announce_tool(event, event.body if isinstance(event.body, ToolCallStarted) else None)

    async def _respond(self, event: ClientEvent, body: ResponseCreateRequest) -> None:
        if body.model is not None:
            check_model(self.gw, body.model)
        principal = await admit_principal(self.gw, self.websocket.headers.get("authorization"))  # rate limit
        target = await resolve_session(self.gw, body, principal, f"ws_session_{uuid.uuid4().hex}")
        self.gw.in_flight += 1
        try:
            async with aclosing(response_events(self.gw, body, target, save_response=body.store)) as events:
                async for item in events:
                    await self.send(item, event.stream_id)
        finally:
            self.gw.in_flight -= 1
        self.session = target

    async def _announce_tool(self, event: ClientEvent, started: ToolCallStarted | None) -> None:
        """Record the tool call in the session and re-time its KV pin to the gap it now expects."""
        if self.session is None or self.session.key is None:
            raise APIError(400, "this connection has no session yet: send response.create first",
                           code="no_active_session")
        key = self.session.key
        async with self.gw.sessions.open(key, self.session.tools, self.session.principal.holds.sessions) as turn:
            if started is not None:
                turn.trajectory.tool_call_started(started.name, started.estimated_duration_s)
            else:
                turn.trajectory.tool_call_finished()
            ttl = turn.trajectory.pin_ttl()
            pinned = turn.trajectory.state.session_id  # the engine's key of the session's KV pin
        self.gw.engine.call(lambda engine: engine.set_session_ttl(pinned, ttl))
        await self.send({"type": "session.kv_ttl.updated", "event_id": event.event_id, "session_id": key.id,
                         "kv_pin_ttl_s": ttl}, event.stream_id)

    async def send(self, payload: dict[str, Any], stream_id: str | None = None) -> None:
        if stream_id is not None:
            payload = {**payload, "stream_id": stream_id}
        async with self._send_lock:
            await self.websocket.send_text(dumps(payload).decode())

    async def send_error(self, error: APIError, event_id: str | None, stream_id: str | None = None) -> None:
        """OpenAI's error event with the HTTP status it would have had, and its Retry-After when it has one."""
        retry_after = (error.headers or {}).get("Retry-After")
        extra = {"retry_after": retry_after} if retry_after is not None else {}
        await self.send({"type": "error", "event_id": event_id, "status": error.status, **extra, **error.body()},
                        stream_id)


def _decode(frame: str | bytes) -> Any:
    """The frame's JSON, or INVALID_JSON."""
    try:
        return json.loads(frame)
    except (ValueError, RecursionError):
        return INVALID_JSON


def as_api_error(error: Exception) -> APIError:
    if isinstance(error, APIError):
        return error
    if isinstance(error, RequestError):
        return from_request_error(error)
    if isinstance(error, ChatTemplateError):
        return APIError(400, str(error), param="input")
    if isinstance(error, STORE_ERRORS):
        return store_unavailable(error)
    log.error("a responses websocket event failed", exc_info=error)
    return APIError(500, "the gateway failed to handle the event", "server_error", code="server_error")


def parse_event(data: Any) -> ClientEvent:
    """A client event from a decoded frame; APIError naming what is wrong with it."""
    if data is INVALID_JSON:
        raise APIError(400, "the message is not valid JSON", code="invalid_json")
    if not isinstance(data, dict):
        raise APIError(400, "an event must be a JSON object with a `type`", code="invalid_event")
    kind, event_id, stream_id = data.get("type"), data.get("event_id"), data.get("stream_id")
    if not isinstance(kind, str):
        raise APIError(400, "the event has no `type`", param="type", code="invalid_event")
    model = EVENT_BODIES.get(kind)
    if model is None:
        raise APIError(400, f"unknown event type {kind!r}; expected one of {sorted(EVENT_BODIES)}", param="type",
                       code="unknown_event_type")
    try:
        body = model.model_validate({key: value for key, value in data.items() if key not in ENVELOPE})
    except ValidationError as error:
        raise validation_error(error.errors(), code="invalid_event") from None
    return ClientEvent(body, event_id if isinstance(event_id, str) else None,
                       stream_id if isinstance(stream_id, str) else None)
