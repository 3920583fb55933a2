"""Admission control against the time-to-first-token SLO. Tracks the prefill work admitted but not yet done
and an estimate of prefill throughput; a new prompt is rejected when the queue ahead of it plus itself
would take longer than the SLO to prefill. The same ledger, with the output tokens each admitted turn is
expected to decode, is the capacity controller's demand (`admitted`): subscribers hear of every change.
Pure policy: no torch, the clock is injected."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from engine.capacity.signals import AdmittedWork

Reason = Literal["admitted", "ttft_slo"]


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    retry_after_s: float  # 0 when admitted; else when enough queued work should have drained
    reason: Reason
    estimated_wait_s: float  # prefill time of the work ahead plus this prompt


class AdmissionController:
    """The gateway calls `check` (or `try_admit`), then `on_admit`, `on_first_token`, and `on_finish` in a
    `finally`. The latter two are idempotent and ignore unknown ids, so calling both is safe. A request's prompt
    tokens leave the ledger at its first token, its expected output tokens and streams when it finishes.

    A prompt that alone exceeds the SLO is admitted only into an empty queue: waiting would not help it."""

    def __init__(self, ttft_slo_s: float, initial_prefill_tokens_per_s: float, ema_alpha: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not ttft_slo_s > 0 or not initial_prefill_tokens_per_s > 0:
            raise ValueError("ttft_slo_s and initial_prefill_tokens_per_s must be positive")
        if not 0 < ema_alpha <= 1:
            raise ValueError(f"ema_alpha must be in (0, 1], got {ema_alpha}")
        self.ttft_slo_s = ttft_slo_s
        self.ema_alpha = ema_alpha
        self._throughput = float(initial_prefill_tokens_per_s)
        self._clock = clock
        self._queued: dict[str, int] = {}  # request id -> prompt tokens, oldest first
        self._head_since = clock()  # when the engine started on the oldest queued request, as far as we know
        self._decoding: dict[str, AdmittedWork] = {}  # request id -> its expected output tokens and streams
        self._admitted = AdmittedWork()
        self.admitted_total = AdmittedWork()  # every request's work as admitted, summed since the start
        self._listeners: list[Callable[[], None]] = []

    @property
    def prefill_tokens_per_s(self) -> float:
        return self._throughput

    @property
    def num_queued(self) -> int:
        return len(self._queued)

    @property
    def queued_tokens(self) -> int:
        """Prompt tokens admitted and not yet past their first token."""
        return self._admitted.prefill_tokens

    @property
    def admitted(self) -> AdmittedWork:
        """The work admitted and not yet served: prompt tokens before their first token, output until the end."""
        return self._admitted

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every change of `admitted`."""
        self._listeners.append(listener)

    def pending_tokens(self) -> float:
        """Queued tokens less the estimated progress on the oldest request since it reached the head."""
        if not self._queued:
            return 0.0
        head_tokens = next(iter(self._queued.values()))
        progress = (self._clock() - self._head_since) * self._throughput
        return self._admitted.prefill_tokens - min(max(0.0, progress), float(head_tokens))

    def check(self, prompt_tokens: int, ttft_slo_s: float | None = None) -> AdmissionDecision:
        """Whether a prompt of this size can start within the SLO (`ttft_slo_s` overrides it, e.g. per priority)."""
        slo = self.ttft_slo_s if ttft_slo_s is None else ttft_slo_s
        pending = self.pending_tokens()
        wait = (pending + prompt_tokens) / self._throughput
        excess = pending + prompt_tokens - max(slo * self._throughput, float(prompt_tokens))
        if not self._queued or excess <= 0:
            return AdmissionDecision(True, 0.0, "admitted", wait)
        return AdmissionDecision(False, excess / self._throughput, "ttft_slo", wait)

    def try_admit(self, request_id: str, prompt_tokens: int, ttft_slo_s: float | None = None,
                  decode_tokens: int = 0, streams: int = 1) -> AdmissionDecision:
        decision = self.check(prompt_tokens, ttft_slo_s)
        if decision.admit:
            self.on_admit(request_id, prompt_tokens, decode_tokens, streams)
        return decision

    def on_admit(self, request_id: str, prompt_tokens: int, decode_tokens: int = 0, streams: int = 1) -> None:
        """`prompt_tokens`: those to prefill (uncached); `decode_tokens`: the output expected over `streams`."""
        if request_id in self._queued or request_id in self._decoding:
            raise ValueError(f"request {request_id!r} is already admitted")
        if decode_tokens < 0 or streams < 0:
            raise ValueError(f"decode_tokens and streams must be >= 0, got {decode_tokens} and {streams}")
        if not self._queued:
            self._head_since = self._clock()
        work = AdmittedWork(max(0, prompt_tokens), decode_tokens, streams, prompts=1)
        self._queued[request_id] = work.prefill_tokens
        self._decoding[request_id] = replace(work, prefill_tokens=0, prompts=0)
        self.admitted_total += work
        self._update(self._admitted + work)

    def on_first_token(self, request_id: str) -> None:
        self._retire(request_id, finished=False)

    def on_finish(self, request_id: str) -> None:
        self._retire(request_id, finished=True)

    def _retire(self, request_id: str, finished: bool) -> None:
        if request_id not in self._queued and not (finished and request_id in self._decoding):
            return
        served = self._dequeue(request_id)
        if finished:
            served += self._decoding.pop(request_id, AdmittedWork())
        self._update(self._admitted - served)

    def _dequeue(self, request_id: str) -> AdmittedWork:
        """Its prompt, nothing when it is past its first token."""
        if request_id not in self._queued:
            return AdmittedWork()
        was_head = request_id == next(iter(self._queued))
        tokens = self._queued.pop(request_id)
        if was_head:
            self._head_since = self._clock()
        return AdmittedWork(tokens, prompts=1)

    def _update(self, admitted: AdmittedWork) -> None:
        self._admitted = admitted
        for listener in self._listeners:
            listener()

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """Fold one measured prefill (tokens computed, wall seconds) into the throughput estimate."""
        if tokens <= 0 or seconds <= 0:
            return
        self._throughput += self.ema_alpha * (tokens / seconds - self._throughput)
