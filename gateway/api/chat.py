"""`POST /v1/chat/completions` and `POST /v1/completions`, non-streaming and SSE streaming.

A chat request joins an agent session with the header `X-Session-Id` (or `metadata.session_id`); the
session keeps its history and KV between turns, so each turn prefills only its new messages. Session ids
belong to the API key: another key's same id is another session. Without one, the request is its own
session and still reuses cached prefixes. `metadata.observation_users` overrides which user messages are
observations (`trajectory.observations`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine import TokenLogprob, fresh_id
from gateway.access import prefix_cache_salt, request_principal
from gateway.api.bodies import body_openapi, parse_body
from gateway.api.generation import ChoiceResult, TurnStats, Usage, generate_choices, record_reply, turn_stats
from gateway.api.protocol import ChatCompletionRequest, CompletionRequest, history_rule, observation_rule, output_budget
from gateway.api.streaming import (
    SSE_DONE,
    ChatStreamWriter,
    drain,
    json_response,
    sse,
    sse_error,
    sse_response,
    started,
    until_done_or_gone,
)
from gateway.api.structured import OutputPlan, output_plan, response_format_grammar
from gateway.auth import Principal
from gateway.content_log import log_turn
from gateway.errors import APIError
from gateway.server.state import GatewayState
from gateway.sessions.store import StoreKey, session_key
from trajectory import step_timer

router = APIRouter()
Event = tuple[int, Any]
SESSION_HEADER = "x-session-id"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # text completions without max_tokens, as OpenAI and vLLM default it


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def check_model(gw: GatewayState, model: str) -> None:
    if model not in (gw.model_name, gw.settings.model):
        raise APIError(404, f"The model `{model}` does not exist; this gateway serves `{gw.model_name}`",
                       "not_found_error", "model", "model_not_found")


@router.post("/v1/chat/completions", response_model=None,
             openapi_extra=body_openapi(ChatCompletionRequest, (SESSION_HEADER,)))
async def chat_completions(request: Request) -> Response:
    gw = gateway_state(request)
    principal = await request_principal(request)
    body = await parse_body(request, ChatCompletionRequest)
    step_timer.leave("parse")
    check_model(gw, body.model)
    session_id = request.headers.get(SESSION_HEADER) or (body.metadata or {}).get("session_id")
    observation_rule(body.metadata)
    history_rule(body.metadata, gw.sessions.policies.settings.history.policies)
    output = output_plan(body.tools, body.tool_choice, body.parallel_tool_calls,
                         response_format_grammar(body.response_format, "response_format"))
    writer = ChatStreamWriter(gw.model_name, output.parse_tools, body.n, gw.tokenizer.decode,
                              None if body.parallel_tool_calls else 1, body.stream)
    usage = Usage()
    key = session_key(principal.name, session_id) if session_id else None
    events = _chat_events(gw, body, key, writer, usage, principal, output)
    if body.stream:
        return await sse_response(events, writer, usage if body.include_usage else None)
    await until_done_or_gone(drain(events), request)
    return json_response(writer.completion(usage))


async def _chat_events(gw: GatewayState, body: ChatCompletionRequest, key: StoreKey | None,
                       writer: ChatStreamWriter, usage: Usage, principal: Principal, output: OutputPlan
                       ) -> AsyncIterator[Event]:
    messages = [m.to_message() for m in body.messages]
    async with gw.sessions.open(key, body.tools, principal.holds.sessions) as turn:
        new = gw.sessions.new_messages(turn, messages) if turn.persistent else messages
        turn.trajectory.vip = principal.is_vip
        offered = gw.sessions.policies.settings.history.policies
        plan = turn.trajectory.add_messages(new, observation_users=observation_rule(body.metadata),
                                            history_policy=history_rule(body.metadata, offered))
        step_timer.enter("plan")
        max_tokens = output_budget(body.max_completion_tokens or body.max_tokens, _max_tokens_param(body),
                                   len(plan.prompt_token_ids), gw.serving_engine.max_model_len,
                                   gw.settings.default_max_tokens)
        salt = prefix_cache_salt(gw, principal, body.cache_salt)
        params = [body.sampling_params(gw.sampling, max_tokens, body.logprob_count(), i,
                                       slo_class=principal.slo_class, cache_salt=salt, grammar=output.grammar)
                  for i in range(body.n)]
        session = plan.session if turn.persistent else None
        stats = turn_stats("chat", plan, turn.persistent)
        step_timer.leave("plan")
        step_timer.enter("engine")
        async for index, out in generate_choices(gw, plan.prompt_token_ids, params, stats, plan.masked_spans,
                                                 session, every_token=body.stream, selection=plan.selection):
            step_timer.enter("outputs")
            usage.prompt_tokens, usage.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
            usage.completion_tokens += len(out.new_token_ids)
            chunks = writer.add(index, out)
            step_timer.leave("outputs")
            yield index, chunks
        step_timer.leave("engine")
        step_timer.enter("session_save")
        if turn.persistent:  # a throwaway session's history ends with the turn
            record_reply(gw, turn, plan, writer.choices[0], writer.reply(0))
        log_turn(gw.settings.log_content, "chat", key.path if key else None, new, writer.choices[0].text)
        step_timer.leave("session_save")


def _max_tokens_param(body: ChatCompletionRequest) -> str:
    return "max_completion_tokens" if body.max_completion_tokens else "max_tokens"


@router.post("/v1/completions", response_model=None, openapi_extra=body_openapi(CompletionRequest))
async def completions(request: Request) -> Response:
    gw = gateway_state(request)
    principal = await request_principal(request)
    body = await parse_body(request, CompletionRequest)
    check_model(gw, body.model)
    prompt = _completion_prompt(body.prompt)
    token_ids = gw.serving_engine.tokenize(prompt)
    max_tokens = output_budget(body.max_tokens, "max_tokens", len(token_ids), gw.serving_engine.max_model_len,
                               COMPLETION_DEFAULT_MAX_TOKENS)
    salt = prefix_cache_salt(gw, principal, body.cache_salt)
    grammar = response_format_grammar(body.response_format, "response_format")
    params = [body.sampling_params(gw.sampling, max_tokens, body.logprobs, i, slo_class=principal.slo_class,
                                   cache_salt=salt, grammar=grammar)
              for i in range(body.n)]
    echoed = "" if not body.echo else prompt if isinstance(prompt, str) else gw.tokenizer.decode(
        gw.serving_engine.validate(prompt, params[0]))  # ids out of the vocabulary: 400 before the decoder sees them
    choices = [ChoiceResult(i, text=echoed) for i in range(body.n)]  # echo: the prompt, then the completion
    usage = Usage()
    created, completion_id = int(time.time()), fresh_id("cmpl-")
    events = generate_choices(gw, token_ids, params, TurnStats("completions", len(token_ids)),
                              every_token=body.stream)
    if body.stream:
        chunks = _completion_chunks(await started(events), choices, usage, body, completion_id, created,
                                    gw.tokenizer.decode)
        return StreamingResponse(chunks, media_type="text/event-stream")

    async def collect() -> None:
        async for index, out in events:
            choices[index].add(out)
            usage.prompt_tokens, usage.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens

    await until_done_or_gone(collect(), request)
    usage.completion_tokens = sum(len(c.token_ids) for c in choices)
    wanted = body.logprobs is not None
    return json_response({
        "id": completion_id, "object": "text_completion", "created": created, "model": body.model,
        "choices": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                     "logprobs": _legacy_logprobs(gw.tokenizer.decode, c.logprobs, 0) if wanted else None}
                    for c in choices],
        "usage": usage.as_openai(),
    })


def _completion_prompt(prompt: str | list[int] | list[str]) -> str | list[int]:
    if isinstance(prompt, str) or all(isinstance(part, int) for part in prompt):
        return prompt  # type: ignore[return-value]
    if len(prompt) == 1:
        return str(prompt[0])
    raise APIError(400, "batched prompts are not supported: send one prompt per request", param="prompt")


def _legacy_logprobs(decode: Callable[[list[int]], str], logprobs: list[TokenLogprob],
                     text_offset: int) -> dict[str, Any]:
    """Text completions' logprobs: the tokens, theirs, the top alternatives', and where each token starts."""
    tokens = [decode([lp.token_id]) for lp in logprobs]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{decode([token_id]): value for token_id, value in lp.top} for lp in logprobs],
            "text_offset": list(itertools.accumulate((len(t) for t in tokens), initial=text_offset))[:-1]}


async def _completion_chunks(events: AsyncIterator[Event], choices: list[ChoiceResult], usage: Usage,
                             body: CompletionRequest, completion_id: str, created: int,
                             decode: Callable[[list[int]], str]) -> AsyncIterator[bytes]:
    try:
        for choice in choices if body.echo else []:  # the prompt's text first
            chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": body.model,
                     "choices": [{"index": choice.index, "text": choice.text, "finish_reason": None,
                                  "logprobs": None}]}
            yield sse(chunk)
        async for index, out in events:
            offset = len(choices[index].text)
            choices[index].add(out)
            logprobs = _legacy_logprobs(decode, out.logprobs, offset) if body.logprobs is not None else None
            usage.prompt_tokens, usage.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
            usage.completion_tokens += len(out.new_token_ids)
            chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": body.model,
                     "choices": [{"index": index, "text": out.new_text, "finish_reason": out.finish_reason,
                                  "logprobs": logprobs}]}
            yield sse(chunk)
        if body.include_usage:
            chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": body.model,
                     "choices": [], "usage": usage.as_openai()}
            yield sse(chunk)
    except Exception as error:  # the stream has started
        yield sse_error(error)
    yield SSE_DONE
