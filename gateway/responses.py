"""`POST /v1/responses` (JSON or SSE) and `GET /v1/responses/{id}`: OpenAI's Responses API on agent sessions.

A response belongs to an agent session. A request without `previous_response_id` starts one (its
`instructions` become the system prompt, its `tools` the session's tools); a request with one continues
the session that produced that response and sends only the new input items. The response-id -> session
record lives in the session store with the session's TTL, so gateway replicas sharing Redis find it too.
The WebSocket mode (`gateway.responses_ws`) runs its turns through `response_events` as well.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from engine.sampling import SamplingParams
from gateway.access import request_principal
from gateway.auth import Principal
from gateway.chat import check_model, gateway_state
from gateway.errors import APIError
from gateway.protocol import content_text, observation_rule
from gateway.responses_events import TERMINAL_EVENTS, Event, ResponseStream, sse_event
from gateway.serving import generate_choices, record_reply, turn_stats
from gateway.sessions import SessionTurn
from gateway.state import GatewayState
from gateway.streaming import until_done_or_gone
from trajectory.agent import Trajectory, TurnPlan
from trajectory.template_types import Message, Role

router = APIRouter()
log = logging.getLogger(__name__)
RESPONSE_KEY = "response:"  # store key of a response's record, before its id
INPUT_ROLES: dict[str, Role] = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


class ResponseCreateRequest(BaseModel):
    """The body of `POST /v1/responses` and of a WebSocket `response.create` event; unknown fields ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    ignore_eos: bool = False  # vLLM's extension: generate max_output_tokens whatever the model says
    metadata: dict[str, str] | None = None
    user: str | None = None
    stream: bool = False
    store: bool = True
    generate: bool = True  # False: a warm-up that only prefills the input into the session's KV

    def echo(self) -> dict[str, Any]:
        """The request fields a response object repeats."""
        return {"instructions": self.instructions, "previous_response_id": self.previous_response_id,
                "tools": self.tools or [], "tool_choice": self.tool_choice,
                "parallel_tool_calls": self.parallel_tool_calls, "max_output_tokens": self.max_output_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "metadata": self.metadata or {},
                "user": self.user, "store": self.store, "text": {"format": {"type": "text"}},
                "truncation": "disabled", "reasoning": None, "background": False}


@dataclass
class SessionTarget:
    """The session a response runs in: where a previous response left it, or a new one."""

    session_id: str | None  # None: a throwaway session, neither saved nor continuable
    tools: list[dict[str, Any]] | None  # the session's tools, in chat-completions form
    turns: int = 0  # turns the session held after the previous response; 0 for a new session
    vip: bool = False  # the caller's key is VIP: the session's KV is never evicted
    slo_class: str | None = None  # the caller's service class (queue order in the engine)

    @property
    def starting(self) -> bool:
        return self.turns == 0


async def resolve_session(gw: GatewayState, body: ResponseCreateRequest, new_session_id: str | None,
                          ) -> SessionTarget:
    if body.previous_response_id is None:
        return SessionTarget(new_session_id, chat_tools(body.tools))
    record = await load_record(gw, body.previous_response_id)
    if record is None:
        raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    return SessionTarget(record["session_id"], record["tools"], record["turns"])


async def load_record(gw: GatewayState, response_id: str) -> dict[str, Any] | None:
    data = await gw.sessions.store.get(RESPONSE_KEY + response_id)
    return None if data is None else dict(json.loads(data))


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses-API function tools ({type, name, parameters}) in the chat-completions form templates expect."""
    if not tools:
        return None
    if any(tool.get("type") != "function" for tool in tools):
        raise APIError(400, "only function tools are supported", param="tools", code="unsupported_tool")
    return [tool if "function" in tool else {"type": "function", "function": {
        key: tool[key] for key in ("name", "description", "parameters") if key in tool}} for tool in tools]


def input_messages(body: ResponseCreateRequest, starting: bool) -> list[Message]:
    system = [Message("system", body.instructions)] if starting and body.instructions else []
    if isinstance(body.input, str):
        return system + ([Message("user", body.input)] if body.input else [])
    messages = system
    for index, item in enumerate(body.input):
        messages = _add_item(messages, item, f"input[{index}]")
    return messages


def _add_item(messages: list[Message], item: dict[str, Any], param: str) -> list[Message]:
    kind = item.get("type", "message")
    if kind == "message" and item.get("role") in INPUT_ROLES:
        return [*messages, Message(INPUT_ROLES[item["role"]], _text(item.get("content"), param))]
    if kind == "function_call_output":
        return [*messages, Message("tool", _text(item.get("output"), param), tool_call_id=item.get("call_id"))]
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
        if messages and messages[-1].role == "assistant":
            last = messages[-1]
            return [*messages[:-1], Message("assistant", last.content, [*(last.tool_calls or []), call])]
        return [*messages, Message("assistant", "", [call])]
    raise APIError(400, f"{param}: input items of type {kind!r} are not supported", param=param,
                   code="unsupported_input_item")


def _text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) and "text" in part for part in content):
        return content_text(content)
    raise APIError(400, f"{param}: only text content is supported", param=param, code="unsupported_content")


async def response_events(gw: GatewayState, body: ResponseCreateRequest, target: SessionTarget,
                          save_response: bool) -> AsyncGenerator[Event]:
    """One turn of the target session as response events. Bad input raises before the first event; a turn
    that fails or is abandoned before its terminal event leaves the session as it was."""
    stream = ResponseStream(gw.model_name, body.echo(), parse_tools=bool(target.tools))
    async with gw.sessions.open(target.session_id, target.tools) as turn:
        _check_latest(turn, target, body)
        turn.trajectory.vip = target.vip
        before, committed = turn.trajectory.to_bytes(), False
        try:
            plan, prompt, params = _prepare(gw, body, target, turn)
            for event in stream.start():
                yield event
            try:
                async for event in _generate(gw, body, turn, plan, prompt, params, stream):
                    yield event
            except Exception as error:  # the response has started: it fails in-band, as OpenAI's do
                log.exception("response %s failed", stream.id)
                for event in stream.fail(f"the engine failed: {error}"):
                    yield event
                return
            events = await _commit(gw, body, target, turn, plan, stream, save_response)
            committed = True
            for event in events:
                yield event
        finally:
            if not committed:
                turn.trajectory = _restore(gw, before, target)


def _check_latest(turn: SessionTurn, target: SessionTarget, body: ResponseCreateRequest) -> None:
    turns = len(turn.trajectory.state.turns)
    if target.starting or turns == target.turns:
        return
    if turns == 0:  # the session expired before its record
        raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    raise APIError(400, f"Previous response with id '{body.previous_response_id}' is not the latest of its "
                        "session; a session continues only from its latest response",
                   param="previous_response_id", code="previous_response_not_latest")


def _restore(gw: GatewayState, data: bytes, target: SessionTarget) -> Trajectory:
    sessions = gw.sessions
    return Trajectory.restore(data, sessions.template, sessions.tokenizer, target.tools, sessions.policies)


def _prepare(gw: GatewayState, body: ResponseCreateRequest, target: SessionTarget, turn: SessionTurn,
             ) -> tuple[TurnPlan, list[int], SamplingParams]:
    """The turn's plan, the prompt to run (a warm-up prefills the history without the assistant header)
    and its sampling parameters; RequestError when the engine would refuse them."""
    plan = turn.trajectory.add_messages(input_messages(body, target.starting),
                                        observation_users=observation_rule(body.metadata))
    max_tokens = (body.max_output_tokens or gw.settings.default_max_tokens) if body.generate else 1
    params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                            ignore_eos=body.ignore_eos, slo_class=target.slo_class)
    prompt = plan.prompt_token_ids if body.generate else turn.trajectory.state.token_ids
    if prompt:
        gw.engine.engine.validate(prompt, params)
    return plan, prompt, params


async def _generate(gw: GatewayState, body: ResponseCreateRequest, turn: SessionTurn, plan: TurnPlan,
                    prompt: list[int], params: SamplingParams, stream: ResponseStream) -> AsyncIterator[Event]:
    if not prompt:
        return
    session = plan.session if turn.persistent else None
    stats = turn_stats("responses", plan, turn.persistent)
    async for _, out in generate_choices(gw, prompt, [params], stats, plan.masked_spans, session):
        if body.generate:
            for event in stream.add(out):
                yield event
        else:
            stream.add_prefill(out)


async def _commit(gw: GatewayState, body: ResponseCreateRequest, target: SessionTarget, turn: SessionTurn,
                  plan: TurnPlan, stream: ResponseStream, save_response: bool) -> list[Event]:
    """Keep the reply in the session and remember the response; the events that finish it."""
    events = stream.finish(with_output=body.generate)
    if body.generate:
        record_reply(gw, turn, plan, stream.choice, stream.reply)
    if turn.persistent:
        await _remember(gw, turn, target, stream.id, events[-1]["response"] if save_response else None)
    return events


async def _remember(gw: GatewayState, turn: SessionTurn, target: SessionTarget, response_id: str,
                    response: dict[str, Any] | None) -> None:
    """Save the session now (before the client can send its next turn) and the response's record."""
    store, ttl, session_id = gw.sessions.store, gw.sessions.ttl_s, turn.trajectory.state.session_id
    await store.put(session_id, turn.trajectory.to_bytes(), ttl)
    record = {"session_id": session_id, "tools": target.tools, "turns": len(turn.trajectory.state.turns),
              "response": response}
    await store.put(RESPONSE_KEY + response_id, json.dumps(record).encode(), ttl)


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponseCreateRequest, request: Request,
                          principal: Principal = Depends(request_principal)) -> Response:
    gw = gateway_state(request)
    if body.model is not None:
        check_model(gw, body.model)
    new_session = f"resp_session_{uuid.uuid4().hex}" if body.store else None
    target = await resolve_session(gw, body, new_session)
    target.vip, target.slo_class = principal.is_vip, principal.slo_class
    events = response_events(gw, body, target, save_response=body.store)
    first = await anext(events)  # bad input raises here, before the stream starts
    if body.stream:
        return StreamingResponse(_sse(first, events), media_type="text/event-stream")
    return JSONResponse(await _final_response(first, events, request))


async def _sse(first: Event, events: AsyncGenerator[Event]) -> AsyncIterator[str]:
    async with aclosing(events):
        yield sse_event(first)
        try:
            async for event in events:
                yield sse_event(event)
        except Exception as error:  # the stream has started: report in-band, as OpenAI does
            log.exception("response stream failed")
            yield sse_event({"type": "error", "code": "server_error", "message": str(error), "param": None})


async def _final_response(first: Event, events: AsyncGenerator[Event], request: Request) -> dict[str, Any]:
    last = first

    async def collect() -> None:
        nonlocal last
        async with aclosing(events):
            async for event in events:
                last = event

    await until_done_or_gone(collect(), request)
    if last["type"] == "response.failed":
        raise APIError(500, last["response"]["error"]["message"], "server_error", code="server_error")
    if last["type"] not in TERMINAL_EVENTS:
        raise APIError(500, "the response ended without finishing", "server_error", code="server_error")
    return dict(last["response"])


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    record = await load_record(gateway_state(request), response_id)
    if record is None or record.get("response") is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", "not_found_error", "response_id",
                       "response_not_found")
    return JSONResponse(record["response"])
