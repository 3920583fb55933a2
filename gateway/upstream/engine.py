"""`UpstreamEngine`: the gateway's engine seam (`AsyncLLMEngine.generate`) served by a pool of upstream replicas.

Each generation goes to the replica its session hashes to (or a vLLM prefill instance, then a decode
instance). A replica that is down, answers 5xx, or gives no output within `first_token_timeout_s` is marked
down and the request retried on another, while `request_budget_s` lasts; then the request is answered 502
(replicas failed) or 503 (none healthy). Once output has reached the client a broken stream cannot be retried:
it raises `UpstreamStreamCut`, which the front ends turn into an error event. The local engine thread runs
the tokenizer front only (session TTL calls and the like are no-ops there), and the capacity controller that
splits vLLM `kv_both` instances between prefill and decode when the pool has some. A turn of a saved session
carries the session's id upstream as `X-Session-Id`, so an agentserve upstream keeps a session of its own."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx

from engine import (
    AsyncLLMEngine,
    CapacitySettings,
    MaskedSpan,
    Prompt,
    QuerySelection,
    RequestOutput,
    SamplingParams,
    SessionRef,
    fresh_id,
)
from gateway.errors import APIError
from gateway.upstream.capacity import UpstreamCapacity
from gateway.upstream.client import Delta, UpstreamFailed, stream_deltas
from gateway.upstream.front import TokenizerFront
from gateway.upstream.masks import note_unapplied
from gateway.upstream.metrics import UpstreamMetrics
from gateway.upstream.outputs import OutputBuilder
from gateway.upstream.pd import decode_body, run_prefill
from gateway.upstream.pool import Replica, UpstreamPool
from gateway.upstream.request import UpstreamRequest, build_request, current_turn

T = TypeVar("T")


class UpstreamStreamCut(RuntimeError):
    """The upstream's stream broke after part of the reply was sent."""


@dataclass(frozen=True)
class Route:
    decode: Replica  # streams the reply (the only replica without prefill/decode instances)
    prefill: Replica | None = None  # a vLLM prefill instance, run first

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return (self.decode,) if self.prefill is None else (self.prefill, self.decode)


class UpstreamEngine(AsyncLLMEngine):
    def __init__(self, front: TokenizerFront, pool: UpstreamPool, metrics: UpstreamMetrics,
                 fallback_model: str, capacity: CapacitySettings | None = None) -> None:
        super().__init__(front)
        if front.tokenizer is None:
            raise ValueError("the gateway needs its model's tokenizer in front of upstreams")
        self.tokenizer = front.tokenizer
        self.pool, self.metrics, self.fallback_model = pool, metrics, fallback_model
        self.settings = pool.settings
        if pool.movable:  # set before LoadSignals asks whether a controller reads its signals
            front.capacity = UpstreamCapacity(capacity or CapacitySettings(), pool)
        self.capacity = front.capacity
        self._client: httpx.AsyncClient | None = None

    @property
    def served_model(self) -> str:
        return self.pool.served_model() or self.fallback_model

    def start(self) -> None:
        super().start()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self._client = httpx.AsyncClient(limits=limits)
        self.pool.start(self._client)
        if self.capacity is not None:
            self.capacity.start(self.call)

    async def close(self) -> None:
        if self.capacity is not None:
            await self.capacity.stop()
        await self.pool.stop()
        if self._client is not None:
            await self._client.aclose()

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                       masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                       every_token: bool = True, selection: QuerySelection | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Every output the upstream streams, whatever `every_token` says: the upstream is read as a stream
        either way (its failover resumes from the tokens seen). Masks and selections are not applied there."""
        token_ids = self.engine.validate(prompt, params)
        request_id = request_id or fresh_id("req-")
        request = build_request(self.served_model, current_turn.get(), token_ids, params, self.tokenizer,
                                request_id)
        unapplied = sum(span.end - span.start for span in masked_spans)
        if unapplied:
            self.metrics.unapplied_masked_tokens.inc(unapplied)
            note_unapplied(unapplied)
        async for out in self._with_failover(request, request_id):
            yield out

    async def _with_failover(self, request: UpstreamRequest, request_id: str) -> AsyncIterator[RequestOutput]:
        deadline = time.monotonic() + self.settings.request_budget_s
        failed: set[str] = set()
        failure: UpstreamFailed | None = None
        while True:
            route = self._route(request.key, frozenset(failed))
            if route is None or time.monotonic() >= deadline:
                raise self._unavailable(failure)
            if failed:
                self.metrics.failovers.inc()
            started = False
            try:
                async for out in self._try(route, request, request_id, deadline):
                    started = True
                    yield out
            except UpstreamFailed as error:
                self._count(route, "cut" if started else "failed")
                if started:
                    raise UpstreamStreamCut(f"the reply broke off: {error}") from error
                self.pool.replicas[error.replica].healthy = False  # until its next health check passes
                failed.add(error.replica)
                failure = error
                continue
            except APIError:
                self._count(route, "refused")
                raise
            self._count(route, "ok")
            return

    def _route(self, key: str, exclude: frozenset[str]) -> Route | None:
        if not self.pool.disaggregated:
            replica = self.pool.pick(key, "any", exclude)
            return None if replica is None else Route(replica)
        decode = self.pool.pick(key, "decode", exclude)
        if decode is None:
            return None
        return Route(decode, self.pool.pick(key, "prefill", exclude))  # no prefill instance: decode prefills

    def _unavailable(self, failure: UpstreamFailed | None) -> APIError:
        if failure is None:
            self.metrics.unavailable.labels("503").inc()
            retry = str(max(1, math.ceil(self.settings.health_interval_s)))
            return APIError(503, "no upstream replica is available", "service_unavailable", None,
                            "upstream_unavailable", {"Retry-After": retry})
        self.metrics.unavailable.labels("502").inc()
        return APIError(502, f"no upstream replica answered within the request's budget; last: {failure}",
                        "upstream_error", None, "upstream_failed")

    def _count(self, route: Route, outcome: str) -> None:
        self.metrics.requests.labels(route.decode.name, outcome).inc()

    async def _try(self, route: Route, request: UpstreamRequest, request_id: str,
                   deadline: float) -> AsyncIterator[RequestOutput]:
        """One try on one route: outputs until the reply finishes; UpstreamFailed when it does not."""
        assert self._client is not None, "start() the engine first"
        timeout = httpx.Timeout(self.settings.stream_idle_timeout_s, connect=self.settings.connect_timeout_s)
        first_by = min(time.monotonic() + self.settings.first_token_timeout_s, deadline)
        body = {**request.body, "model": route.decode.spec.model or self.served_model}
        upstream_id = str(uuid.uuid4())  # both legs' X-Request-Id; a UUID, as vLLM's proxy sends (llama.cpp checks)
        headers = {"X-Request-Id": upstream_id, **request.headers}
        builder = OutputBuilder(request_id, request.prompt_tokens, self.tokenizer.encode)
        with _lease(route):
            if route.prefill is not None:
                with route.prefill.prefilling(request.prompt_tokens):
                    kv = await _before(first_by, route.prefill, run_prefill(
                        self._client, route.prefill, request.path, body, headers, timeout))
                body = decode_body(body, kv)
            deltas = stream_deltas(self._client, route.decode, request.path, body, headers, timeout)
            try:
                first = await _before(first_by, route.decode, _first_output(deltas, builder))
                if first is not None:
                    yield first
                async for delta in deltas:
                    out = builder.add(delta)
                    if out is not None:
                        yield out
                if builder.finish_reason is None:
                    raise UpstreamFailed(route.decode.name, "the stream ended without a finish reason")
                yield builder.finish()
            finally:
                await deltas.aclose()


async def _first_output(deltas: AsyncIterator[Delta], builder: OutputBuilder) -> RequestOutput | None:
    """The stream's first output with text; None when the whole stream had none."""
    async for delta in deltas:
        out = builder.add(delta)
        if out is not None:
            return out
    return None


async def _before(at: float, replica: Replica, work: Awaitable[T]) -> T:
    """The work's result, in this task (a stream opened here must be read and closed here), before `at`."""
    try:
        async with asyncio.timeout(max(0.0, at - time.monotonic())):
            return await work
    except TimeoutError as error:
        raise UpstreamFailed(replica.name, "no output within the first-token timeout") from error


@contextlib.contextmanager
def _lease(route: Route) -> Iterator[None]:
    for replica in route.replicas:
        replica.in_flight += 1
    route.decode.decode_streams += 1
    try:
        yield
    finally:
        for replica in route.replicas:
            replica.in_flight -= 1
        route.decode.decode_streams -= 1
