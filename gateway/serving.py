"""One generation through the engine for the HTTP and WebSocket front ends: a turn of a session
(chat, responses) or a raw prompt (completions), with n choices streamed as (choice index, output)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from engine.mask import MaskedSpan
from engine.output import RequestOutput
from engine.sampling import SamplingParams, TokenLogprob
from engine.sequence import SessionRef
from gateway.sessions import SessionTurn, message_digest
from gateway.state import GatewayState
from trajectory.agent import TurnPlan
from trajectory.template_types import Message


@dataclass
class ChoiceResult:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, out: RequestOutput) -> None:
        self.token_ids += out.new_token_ids
        self.text += out.new_text
        self.logprobs += out.logprobs
        self.finish_reason = out.finish_reason


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def as_openai(self) -> dict[str, object]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


async def generate_choices(gw: GatewayState, prompt: Sequence[int], params: list[SamplingParams],
                           masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                           ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Run len(params) choices of one prompt; only choice 0 pins the session's KV."""
    streams = [gw.engine.generate(list(prompt), p, f"req-{uuid.uuid4().hex}", masked_spans=masked_spans,
                                  session=session if index == 0 else None) for index, p in enumerate(params)]
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    async for item in _merge(streams):
        yield item


async def _merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                await queue.put((index, out))
            await queue.put((index, None))
        except Exception as error:  # forwarded to the consumer, which raises it
            await queue.put((index, error))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def record_reply(gw: GatewayState, turn: SessionTurn, plan: TurnPlan, choice: ChoiceResult,
                 reply: Message) -> None:
    """Keep the reply in the session's history and re-time its KV pin for the expected tool gap."""
    trajectory = turn.trajectory
    trajectory.record_reply(choice.token_ids, reply)
    trajectory.state.client_digests.append(message_digest(reply))
    if turn.persistent:
        key, ttl = plan.session.key, trajectory.pin_ttl()
        gw.engine.call(lambda engine: engine.set_session_ttl(key, ttl))
