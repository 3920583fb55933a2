"""`POST /v1/responses` (JSON or SSE) and `GET /v1/responses/{id}`: OpenAI's Responses API on agent sessions.

A response belongs to an agent session. A request without `previous_response_id` starts one (its
`instructions` become the system prompt, its `tools` the session's tools); a request with one continues
the session that produced that response and sends only the new input items. The response-id -> session
record lives in the session store with the session's TTL, so gateway replicas sharing Redis find it too.
Sessions and responses belong to the API key that made them: another key's ids are answered exactly as
unknown ones. The WebSocket mode (`gateway.api.responses.ws`) runs its turns through `response_events` as well.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from engine import GrammarSpec, SamplingParams
from gateway.access import prefix_cache_salt, request_principal
from gateway.api.bodies import body_openapi, parse_body
from gateway.api.chat import check_model, gateway_state
from gateway.api.generation import generate_choices, record_reply, turn_stats
from gateway.api.protocol import history_rule, observation_rule, output_budget
from gateway.api.responses.events import TERMINAL_EVENTS, Event, ResponseStream, sse_event
from gateway.api.responses.input import ResponseCreateRequest, chat_tools, input_messages
from gateway.api.streaming import json_response, until_done_or_gone
from gateway.api.structured import output_plan, text_format_grammar
from gateway.auth import Principal
from gateway.content_log import log_turn
from gateway.errors import APIError
from gateway.server.state import GatewayState
from gateway.sessions.manager import SessionTurn
from gateway.sessions.store import StoreKey, session_key
from trajectory.agent import TurnPlan
from trajectory.json_codec import dumps, loads

router = APIRouter()
log = logging.getLogger(__name__)


@dataclass
class SessionTarget:
    """The session a response runs in: where a previous response of the same key left it, or a new one."""

    key: StoreKey | None  # None: a throwaway session, neither saved nor continuable
    tools: list[dict[str, Any]] | None  # the session's tools, in chat-completions form
    principal: Principal  # who asks: owns the session and its responses, sets VIP and service class
    turns: int = 0  # turns the session held after the previous response; 0 for a new session

    @property
    def starting(self) -> bool:
        return self.turns == 0


def response_key(principal: Principal, response_id: str) -> StoreKey:
    return StoreKey("response", principal.name, response_id)


async def resolve_session(gw: GatewayState, body: ResponseCreateRequest, principal: Principal,
                          new_session_id: str | None) -> SessionTarget:
    """A response id of another key is answered exactly as an unknown one."""
    if body.previous_response_id is None:
        key = session_key(principal.name, new_session_id) if new_session_id else None
        return SessionTarget(key, chat_tools(body.tools), principal)
    record = await load_record(gw, response_key(principal, body.previous_response_id))
    if record is None:
        raise APIError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    return SessionTarget(session_key(principal.name, record["session_id"]), record["tools"], principal,
                         record["turns"])


async def load_record(gw: GatewayState, key: StoreKey) -> dict[str, Any] | None:
    data = await gw.sessions.store.get(key)
    return None if data is None else dict(loads(data))


async def response_events(gw: GatewayState, body: ResponseCreateRequest, target: SessionTarget,
                          save_response: bool, streamed: bool = True) -> AsyncGenerator[Event]:
    """One turn of the target session as response events. Bad input raises before the first event; a turn
    that fails or is abandoned before its terminal event leaves the session as it was. Events nobody sees as
    they come (`streamed` off: an HTTP response not streamed) take the engine's outputs at the first token and
    the end only."""
    output = output_plan(target.tools, body.tool_choice, body.parallel_tool_calls, text_format_grammar(body.text))
    stream = ResponseStream(gw.model_name, body.echo(body.sampling(gw.sampling)), parse_tools=output.parse_tools,
                            max_tool_calls=None if body.parallel_tool_calls else 1)
    async with gw.sessions.open(target.key, target.tools, target.principal.holds.sessions) as turn:
        await _continue_from_previous(gw, turn, target, body)
        turn.trajectory.vip = target.principal.is_vip
        committed = False
        try:
            plan, prompt, params = _prepare(gw, body, target, turn, output.grammar)
            for event in stream.start():
                yield event
            try:
                async for event in _generate(gw, body, turn, plan, prompt, params, stream, streamed):
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
                gw.sessions.roll_back(turn, target.tools)


async def _continue_from_previous(gw: GatewayState, turn: SessionTurn, target: SessionTarget,
                                  body: ResponseCreateRequest) -> None:
    """The session as `previous_response_id` left it: its latest response, or the one before when the client
    continues from that one again. That is a retry whose earlier attempt was committed but never reached the
    client (its stream dropped after the reply was kept): the turn the client never heard of is given up, so
    the conversation holds each reply the client received once, and none it did not."""
    state, previous = turn.trajectory.state, body.previous_response_id
    if target.starting or state.response_ids[-1:] == [previous]:
        return
    if not state.turns:  # the session expired before its record
        raise APIError(400, f"Previous response with id '{previous}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    if not state.response_ids and len(state.turns) == target.turns:  # stored before response ids were kept
        return
    if previous in state.response_ids[:-1] and await gw.sessions.rewind(turn, target.tools):
        if turn.trajectory.state.response_ids[-1:] == [previous]:
            return
        gw.sessions.roll_back(turn, target.tools)
    raise APIError(400, f"Previous response with id '{previous}' is not the latest of its session; a session "
                        "continues only from its latest response or the one before it",
                   param="previous_response_id", code="previous_response_not_latest")


def _prepare(gw: GatewayState, body: ResponseCreateRequest, target: SessionTarget, turn: SessionTurn,
             grammar: GrammarSpec | None) -> tuple[TurnPlan, list[int], SamplingParams]:
    """The turn's plan, the prompt to run (a warm-up prefills the history without the assistant header)
    and its sampling parameters; RequestError when the engine would refuse them."""
    offered = gw.sessions.policies.settings.history.policies
    plan = turn.trajectory.add_messages(input_messages(body, target.starting),
                                        observation_users=observation_rule(body.metadata),
                                        history_policy=history_rule(body.metadata, offered))
    prompt = plan.prompt_token_ids if body.generate else turn.trajectory.state.token_ids
    max_tokens = output_budget(body.max_output_tokens, "max_output_tokens", len(prompt),
                               gw.serving_engine.max_model_len, gw.settings.default_max_tokens) if body.generate else 1
    params = SamplingParams(max_tokens=max_tokens, **body.sampling(gw.sampling), ignore_eos=body.ignore_eos,
                            slo_class=target.principal.slo_class,
                            cache_salt=prefix_cache_salt(gw, target.principal, body.cache_salt),
                            grammar=grammar if body.generate else None)
    gw.serving_engine.validate(prompt, params)
    return plan, prompt, params


async def _generate(gw: GatewayState, body: ResponseCreateRequest, turn: SessionTurn, plan: TurnPlan,
                    prompt: list[int], params: SamplingParams, stream: ResponseStream, streamed: bool
                    ) -> AsyncIterator[Event]:
    session = plan.session if turn.persistent else None
    stats = turn_stats("responses", plan, turn.persistent)
    async for _, out in generate_choices(gw, prompt, [params], stats, plan.masked_spans, session,
                                         every_token=streamed, selection=plan.selection):
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
        if turn.persistent:  # a throwaway session's history ends with the turn
            record_reply(gw, turn, plan, stream.choice, stream.reply)
        log_turn(gw.settings.log_content, "responses", target.key.path if target.key else None,
                 input_messages(body, target.starting), stream.choice.text)
    if target.key is not None:
        await _remember(gw, turn, target.key, target, stream.id, events[-1]["response"] if save_response else None)
    return events


async def _remember(gw: GatewayState, turn: SessionTurn, key: StoreKey, target: SessionTarget, response_id: str,
                    response: dict[str, Any] | None) -> None:
    """Save the session now (before the client can send its next turn) and the response's record; the session
    remembers its latest two responses, from which a client may continue (`_continue_from_previous`)."""
    state = turn.trajectory.state
    state.response_ids = [*state.response_ids[-1:], response_id]
    await gw.sessions.save(turn, ends_turn=True)
    record = {"session_id": key.id, "tools": target.tools, "turns": len(turn.trajectory.state.turns),
              "response": response}
    await gw.sessions.store.put(response_key(target.principal, response_id), dumps(record), gw.sessions.ttl_s)


@router.post("/v1/responses", response_model=None, openapi_extra=body_openapi(ResponseCreateRequest))
async def create_response(request: Request) -> Response:
    gw = gateway_state(request)
    principal = await request_principal(request)
    body = await parse_body(request, ResponseCreateRequest)
    if body.model is not None:
        check_model(gw, body.model)
    new_session = f"resp_session_{uuid.uuid4().hex}" if body.store else None
    target = await resolve_session(gw, body, principal, new_session)
    events = response_events(gw, body, target, save_response=body.store, streamed=body.stream)
    first = await anext(events)  # bad input raises here, before the stream starts
    if body.stream:
        return StreamingResponse(_sse(first, events), media_type="text/event-stream")
    return json_response(await _final_response(first, events, request))


async def _sse(first: Event, events: AsyncGenerator[Event]) -> AsyncIterator[bytes]:
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
async def get_response(response_id: str, request: Request,
                       principal: Principal = Depends(request_principal)) -> Response:
    """A response of the caller's key; another key's is answered exactly as an unknown one."""
    record = await load_record(gateway_state(request), response_key(principal, response_id))
    if record is None or record.get("response") is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", "not_found_error", "response_id",
                       "response_not_found")
    return json_response(record["response"])
