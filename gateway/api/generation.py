"""One generation through the engine for the HTTP and WebSocket front ends: a turn of a session
(chat, responses) or a raw prompt (completions), with n choices streamed as (choice index, output)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from engine import MaskedSpan, QuerySelection, RequestOutput, SamplingParams, SessionRef, TokenLogprob, fresh_id
from gateway.admission import AdmissionDecision
from gateway.errors import APIError
from gateway.metrics import RequestTrace
from gateway.server.state import GatewayState
from gateway.sessions.manager import SessionTurn, message_digest
from predictor.records import TurnRecord
from trajectory.agent import TurnPlan
from trajectory.phase.classifier import PhaseEstimate
from trajectory.template.types import Message


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


@dataclass
class TurnStats:
    """What the metrics want to know of a turn beyond its outputs."""

    endpoint: str
    prefill_estimate: int  # tokens likely to be prefilled (the turn's delta, or the whole prompt)
    pruned_tokens: int = 0
    masked_tokens: int = 0
    phase: PhaseEstimate | None = None
    session_id: str | None = None


def turn_stats(endpoint: str, plan: TurnPlan, persistent: bool) -> TurnStats:
    pruned = sum(p.tokens_before - p.tokens_after for p in plan.pruning)
    masked = sum(span.end - span.start for span in plan.masked_spans)
    estimate = plan.new_tokens if persistent else len(plan.prompt_token_ids)
    return TurnStats(endpoint, estimate, pruned, masked, plan.phase, plan.session.key)


async def generate_choices(gw: GatewayState, prompt: Sequence[int], params: list[SamplingParams],
                           stats: TurnStats, masked_spans: Sequence[MaskedSpan] = (),
                           session: SessionRef | None = None, every_token: bool = True,
                           selection: QuerySelection | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Run len(params) choices of one prompt, once admission control lets it in (it waits its turn in
    `gateway.admission.queue` while that fits the TTFT budget); only choice 0 pins the session's KV. Raises APIError 503
    (with Retry-After) when the queued prefill work would break the TTFT SLO, or its streams with those in flight
    the TPOT SLO, for longer than the budget lets it wait. Without `every_token` (a reply not streamed) each
    choice gives two outputs, its first token's and its last (`AsyncLLMEngine.generate`)."""
    request_id = fresh_id("req-")
    trace = gw.metrics.request_started(stats.endpoint)
    decode = sum(gw.signals.expected_output_tokens(stats.session_id, p.max_tokens) for p in params)
    key = stats.session_id or f"prompt-{hash(tuple(prompt))}"  # a refused request's retry keeps its place
    in_line = time.monotonic()
    decision = await gw.admission_queue.admit(request_id, stats.prefill_estimate, key, decode, len(params))
    gw.metrics.admission_waited(trace, time.monotonic() - in_line, decision.admit)
    if not decision.admit:
        gw.metrics.rejected(decision.reason)
        raise _overloaded(decision)
    streams = [gw.engine.generate(list(prompt), p, f"{request_id}-{index}", masked_spans=masked_spans,
                                  session=session if index == 0 else None, every_token=every_token,
                                  selection=selection)
               for index, p in enumerate(params)]
    gw.metrics.handed_to_engine(trace)
    observed = _Observed(gw, trace, request_id, time.monotonic())
    if stats.session_id is not None and stats.phase is not None:
        gw.signals.turn_started(stats.session_id, stats.phase, stats.prefill_estimate)
    try:
        async for index, out in (_single(streams[0]) if len(streams) == 1 else _merge(streams)):
            observed.output(index, out)
            yield index, out
    finally:  # the turn's bookkeeping (metrics, admission, load signals) after the response's last bytes
        asyncio.get_running_loop().call_soon(observed.done, stats)


def _overloaded(decision: AdmissionDecision) -> APIError:
    """The 503 of a refused request; Retry-After: when enough admitted work should have drained."""
    detail = (f"about {decision.estimated_wait_s:.1f} s to the first token" if decision.reason == "ttft_slo"
              else f"about {decision.estimated_tpot_s * 1000:.0f} ms per output token with this request")
    return APIError(503, f"the engine is overloaded: {detail}", "service_unavailable", None, "overloaded",
                    {"Retry-After": str(max(1, math.ceil(decision.retry_after_s)))})


async def _single(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    async for out in stream:
        yield 0, out


@dataclass
class _Observed:
    gw: GatewayState
    trace: RequestTrace
    request_id: str
    submitted: float
    first: bool = True
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "abort"
    last_output_at: dict[int, float] = field(default_factory=dict)  # choice index -> when its tokens last came

    def output(self, index: int, out: RequestOutput) -> None:
        self.prompt_tokens, self.cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
        self.output_tokens += len(out.new_token_ids)
        if out.new_token_ids and self.first:
            self.first = False
            self.gw.metrics.first_token(self.trace, len(out.new_token_ids))
            self.gw.admission.on_first_token(self.request_id)
        elif out.new_token_ids:
            self.gw.metrics.token(self.trace, len(out.new_token_ids))
        if out.new_token_ids:
            self._observe_gap(index, len(out.new_token_ids))
        if out.finished and out.finish_reason:
            self.finish_reason = out.finish_reason

    def _observe_gap(self, index: int, tokens: int) -> None:
        """The time since this choice's previous tokens: the decode rate admission weighs against the TPOT SLO."""
        now = time.monotonic()
        previous = self.last_output_at.get(index)
        if previous is not None:
            self.gw.admission.observe_tokens(self.request_id, tokens, now - previous)
        self.last_output_at[index] = now

    def done(self, stats: TurnStats) -> None:
        self.gw.admission.on_finish(self.request_id)
        masked = stats.masked_tokens if self.gw.applies_masks else 0  # upstream: counted as unapplied
        self.gw.metrics.finished(self.trace, self.finish_reason, prompt_tokens=self.prompt_tokens,
                                 cached_tokens=self.cached_tokens, pruned_tokens=stats.pruned_tokens,
                                 masked_tokens=masked)
        if stats.phase is None or stats.session_id is None:
            return
        phase = stats.phase.phase.value
        self.gw.metrics.turn(phase)
        new_tokens = max(0, self.prompt_tokens - self.cached_tokens)
        self.gw.signals.turn_finished(stats.session_id, self.submitted, TurnRecord(
            new_tokens, self.prompt_tokens, self.cached_tokens, self.output_tokens, 0.0, phase))  # type: ignore[arg-type]


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
