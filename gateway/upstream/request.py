"""What an upstream is sent for one generation. A turn of a session goes as chat messages: the session's
history as the gateway holds it (observations already pruned on ingest), so the upstream renders it with its
own chat template and tokenizer; a raw prompt (text completions) goes as its text. The turn is the one that
`UpstreamSessions.open` made current for the task."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from engine import GrammarSpec, SamplingParams, Tokenizer
from gateway.sessions.manager import SessionManager, SessionTurn
from gateway.sessions.store import StoreKey
from trajectory.template.types import Message, ToolSchemas

current_turn: ContextVar[SessionTurn | None] = ContextVar("agentserve_upstream_turn", default=None)


class UpstreamSessions(SessionManager):
    """The session manager, with the open turn made current for the generation that follows in this task."""

    @asynccontextmanager
    async def open(self, key: StoreKey | None, tools: ToolSchemas | None = None,
                   max_sessions: int | None = None) -> AsyncIterator[SessionTurn]:
        async with super().open(key, tools, max_sessions) as turn:
            current_turn.set(turn)
            yield turn


@dataclass
class UpstreamRequest:
    path: str  # under the replica's base URL: /chat/completions or /completions
    body: dict[str, Any]
    key: str  # what affinity hashes: the session id
    prompt_tokens: int  # the gateway's own count, until the upstream reports its own
    session_id: str | None = None  # a saved session's (namespaced by API key); None: a throwaway turn

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.session_id is None else {"X-Session-Id": self.session_id}


def openai_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        out["name"] = message.name
    return out


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                              "top_p": params.top_p}
    if params.top_k is not None:
        fields["top_k"] = params.top_k
    if params.min_p:
        fields["min_p"] = params.min_p
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.ignore_eos:
        fields["ignore_eos"] = True
    if params.grammar is not None:
        fields.update(grammar_fields(params.grammar))
    return fields


def grammar_fields(grammar: GrammarSpec) -> dict[str, Any]:
    """A structured output as an upstream takes it: OpenAI's `response_format` for JSON (vLLM, SGLang and
    llama.cpp's server all read it), vLLM's `structured_outputs` for a Lark grammar or a regex (forced tool calls;
    the Lark grammar uses llguidance's `%json`, so the upstream vLLM must run its llguidance backend). A lazy
    grammar (a call the model may start, `tool_choice: auto`) is not sent: the upstream parses its own calls."""
    if grammar.trigger:
        return {}
    if grammar.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source)
        schema.pop("x-guidance", None)  # our compile options, not part of the schema
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}
    return {"structured_outputs": {"grammar" if grammar.kind == "lark" else "regex": grammar.source}}


def build_request(model: str, turn: SessionTurn | None, prompt: Sequence[int], params: SamplingParams,
                  tokenizer: Tokenizer, request_id: str) -> UpstreamRequest:
    stream = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if turn is None:
        body = {**stream, "prompt": tokenizer.decode(list(prompt)), **sampling_fields(params)}
        return UpstreamRequest("/completions", body, request_id, len(prompt))
    renderer = turn.trajectory.renderer
    body = {**stream, "messages": [openai_message(m) for m in renderer.messages], **sampling_fields(params)}
    if renderer.tools:
        body["tools"] = list(renderer.tools)
    session_id = turn.trajectory.state.session_id
    return UpstreamRequest("/chat/completions", body, session_id, len(prompt),
                           session_id if turn.persistent else None)
