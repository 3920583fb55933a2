"""Admission control against the SLO. Two checks, one shape: the work a new request would wait behind, at
the rate the engine was seen to do it, must fit a share (`headroom`) of the SLO.

- TTFT: the prompt tokens admitted but not yet past their first token, plus this prompt, over the prefill
  rate: the ledger's own drain rate (its tokens reaching their first token per second of a busy queue), so
  it is measured under the real mix of prefill chunks and decode steps, in the ledger's own token units.
- TPOT: the streams in flight, with this request's, over the decode rate (stream-tokens per second: each
  observed gap between a stream's tokens, times the streams in flight then) is the expected time per output
  token; it must fit the TPOT SLO. Off until a TPOT SLO is given and a gap was observed.

Out of the box (no TTFT SLO set) the SLO is derived from the host's measured speed: the time to prefill one full
context window (`slo_context_tokens`) at the measured prefill rate, at least `MIN_DERIVED_SLO_S`: on a slow CPU a
fixed few seconds would refuse work the server is serving at its own pace, and in tokens the budget is the
same on any host. It trusts measurements only: before the first token has measured the rate there is no SLO,
and the initial guess is not averaged in (a fast host's guess, folded into a slow host's first measurements,
refused its first turns after seconds of waiting).

A stall (the oldest queued prompt overdue, or the streams silent, by more than the TTFT budget) refuses
everything until the engine answers again: a request admitted then would wait the stall out.

Under overload the admitted work stands at the limit, so the mean admitted request sees the limit: the
headroom leaves room for the p99 above the mean. A refusal says when enough work should have drained.

The same ledger, with the output tokens each admitted turn is expected to decode, is the capacity
controller's demand (`admitted`): subscribers hear of every change. Pure policy: no torch, the clock is
injected."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from engine import AdmittedWork

Reason = Literal["admitted", "ttft_slo", "tpot_slo"]
HEADROOM = 0.5  # share of each SLO the estimates may fill
MIN_DERIVED_SLO_S = 5.0  # the derived TTFT SLO's floor (a fast host's full context still gets a few seconds)


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    retry_after_s: float  # 0 when admitted; else when enough admitted work should have drained
    reason: Reason
    estimated_wait_s: float  # prefill time of the work ahead plus this prompt
    estimated_tpot_s: float = 0.0  # time per output token with this request's streams in flight; 0: unmeasured


@dataclass
class RateEstimate:
    """A rate as the ratio of two EMAs, of amounts done and of the seconds they took: a burst done at once
    (no seconds) and a quiet stretch (no amount) average out instead of swinging the rate."""

    alpha: float
    amount: float = 0.0
    seconds: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.amount / self.seconds if self.seconds > 0 else None

    def observe(self, amount: float, seconds: float) -> None:
        if amount < 0 or seconds < 0:
            return
        self.amount += self.alpha * (amount - self.amount)
        self.seconds += self.alpha * (seconds - self.seconds)


class AdmissionController:
    """The gateway's line (`AdmissionQueue`) calls `check`, then `on_admit` (`try_admit` does both); the gateway
    then `observe_tokens` for each output after the first, `on_first_token`, and `on_finish` in a `finally`.
    The latter two are idempotent and ignore unknown ids, so calling both is safe. A request's prompt tokens
    leave the ledger at its first token, its expected output tokens and streams when it finishes.

    A prompt that alone exceeds the TTFT budget is admitted only into an empty queue, and streams that alone
    exceed the TPOT budget only when none are in flight: waiting would not help them."""

    def __init__(self, ttft_slo_s: float | None, initial_prefill_tokens_per_s: float, ema_alpha: float = 0.2,
                 clock: Callable[[], float] = time.monotonic, tpot_slo_s: float | None = None,
                 headroom: float = HEADROOM, slo_context_tokens: int = 8192) -> None:
        if (ttft_slo_s is not None and not ttft_slo_s > 0) or not initial_prefill_tokens_per_s > 0:
            raise ValueError("ttft_slo_s and initial_prefill_tokens_per_s must be positive")
        if not slo_context_tokens > 0:
            raise ValueError(f"slo_context_tokens must be positive, got {slo_context_tokens}")
        if not 0 < ema_alpha <= 1 or not 0 < headroom <= 1:
            raise ValueError(f"ema_alpha and headroom must be in (0, 1], got {ema_alpha} and {headroom}")
        if tpot_slo_s is not None and not tpot_slo_s > 0:
            raise ValueError(f"tpot_slo_s must be positive, got {tpot_slo_s}")
        self.ttft_slo_s, self.tpot_slo_s, self.headroom, self.ema_alpha = ttft_slo_s, tpot_slo_s, headroom, ema_alpha
        self.slo_context_tokens = slo_context_tokens
        self._initial_prefill_tokens_per_s = float(initial_prefill_tokens_per_s)
        self._prefill = RateEstimate(ema_alpha, self._initial_prefill_tokens_per_s, 1.0)  # prompt tokens per second
        self._measured = RateEstimate(ema_alpha)  # the same, unseeded: what the derived SLO trusts
        self._decode = RateEstimate(ema_alpha)  # stream-tokens per second; unmeasured at the start
        self._clock = clock
        self._queued: dict[str, int] = {}  # request id -> prompt tokens, oldest first
        self._head_since = clock()  # when the engine started on the oldest queued request, as far as we know
        self._drained_at = self._head_since  # the latest first token, or when the queue last filled
        self._token_at: float | None = None  # the latest output token of any stream, first tokens included
        self._decoding: dict[str, AdmittedWork] = {}  # request id -> its expected output tokens and streams
        self._decoded: dict[str, int] = {}  # request id -> output tokens seen, over all its streams
        self._admitted = AdmittedWork()
        self.admitted_total = AdmittedWork()  # every request's work as admitted, summed since the start
        self._listeners: list[Callable[[], None]] = []

    @property
    def prefill_tokens_per_s(self) -> float:
        if self.ttft_slo_s is None and self._measured.rate:  # a derived SLO: measurements only, no initial guess
            return self._measured.rate
        return self._prefill.rate or self._initial_prefill_tokens_per_s  # the initial rate while none is measurable

    @property
    def slo_s(self) -> float:
        """The TTFT SLO: the one set, else a full context's prefill at the measured rate (at least the floor);
        none (infinite) before a first token measured it: nothing is refused on a guessed speed."""
        if self.ttft_slo_s is not None:
            return self.ttft_slo_s
        rate = self._measured.rate
        return max(MIN_DERIVED_SLO_S, self.slo_context_tokens / rate) if rate else math.inf

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Output tokens per second over all streams; None until a gap between two tokens was observed."""
        return self._decode.rate

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
        progress = (self._clock() - self._head_since) * self.prefill_tokens_per_s
        return self._admitted.prefill_tokens - min(max(0.0, progress), float(head_tokens))

    def expected_tpot_s(self, streams: int = 0) -> float:
        """Time per output token with `streams` more in flight; 0 while the decode rate is unmeasured."""
        rate = self._decode.rate
        return (self._admitted.streams + streams) / rate if rate else 0.0

    def check(self, prompt_tokens: int, ttft_slo_s: float | None = None, streams: int = 1) -> AdmissionDecision:
        """Whether a prompt of this size can start within the TTFT SLO (`ttft_slo_s` overrides it, e.g. per
        priority), and its `streams` decode within the TPOT SLO. Refused on both: the later retry counts."""
        slo = self.slo_s if ttft_slo_s is None else ttft_slo_s
        rate = self.prefill_tokens_per_s
        pending = self.pending_tokens()
        wait, tpot = (pending + prompt_tokens) / rate, self.expected_tpot_s(streams)
        excess = pending + prompt_tokens - max(self.headroom * slo * rate, float(prompt_tokens))
        prefill_retry = excess / rate if self._queued and excess > 0 else 0.0
        late = self.lateness_s()
        if late > self.headroom * slo:  # stalled: a request admitted now waits the stall out too
            wait, prefill_retry = wait + late, max(prefill_retry, late)
        decode_retry = self._decode_retry_s(streams)
        if prefill_retry == decode_retry == 0.0:
            return AdmissionDecision(True, 0.0, "admitted", wait, tpot)
        reason: Reason = "ttft_slo" if prefill_retry > 0 else "tpot_slo"
        return AdmissionDecision(False, max(prefill_retry, decode_retry), reason, wait, tpot)

    def lateness_s(self) -> float:
        """How far the engine is behind the estimates: the oldest queued prompt overdue, or no token from the
        streams past their first for longer than a step. Past the TTFT budget, `check` takes it for a stall."""
        now, late = self._clock(), 0.0
        if self._queued:
            late = now - self._head_since - next(iter(self._queued.values())) / self.prefill_tokens_per_s
        decoding = sum(work.streams for request_id, work in self._decoding.items() if request_id not in self._queued)
        rate = self._decode.rate
        if decoding and rate and self._token_at is not None:
            late = max(late, now - self._token_at - decoding / rate)
        return max(0.0, late)

    def _decode_retry_s(self, streams: int) -> float:
        """0 when `streams` more fit the TPOT budget; else when enough streams in flight should have finished:
        the soonest to finish, by their expected output tokens left, at the current time per token."""
        rate = self._decode.rate
        if self.tpot_slo_s is None or not rate or not self._admitted.streams:
            return 0.0
        fitting = math.floor(self.headroom * self.tpot_slo_s * rate)
        must_finish = self._admitted.streams + streams - fitting
        if must_finish <= 0:
            return 0.0
        left = sorted(self._tokens_left(request_id) for request_id, work in self._decoding.items()
                      for _ in range(work.streams))
        return left[min(must_finish, len(left)) - 1] * self.expected_tpot_s()

    def _tokens_left(self, request_id: str) -> float:
        """Expected output tokens a stream of this request has yet to decode; at least one."""
        work = self._decoding[request_id]
        return max(1.0, (work.decode_tokens - self._decoded.get(request_id, 0)) / max(1, work.streams))

    def try_admit(self, request_id: str, prompt_tokens: int, ttft_slo_s: float | None = None,
                  decode_tokens: int = 0, streams: int = 1) -> AdmissionDecision:
        decision = self.check(prompt_tokens, ttft_slo_s, streams)
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
            self._head_since = self._drained_at = self._clock()
        work = AdmittedWork(max(0, prompt_tokens), decode_tokens, streams, prompts=1)
        self._queued[request_id] = work.prefill_tokens
        self._decoding[request_id] = replace(work, prefill_tokens=0, prompts=0)
        self.admitted_total += work
        self._update(self._admitted + work)

    def on_first_token(self, request_id: str) -> None:
        self._retire(request_id, finished=False)

    def on_finish(self, request_id: str) -> None:
        self._retire(request_id, finished=True)

    def observe_tokens(self, request_id: str, tokens: int, seconds: float) -> None:
        """`tokens` more output of one of a request's streams, `seconds` after its previous output: over the
        streams in flight now, a measure of the decode rate (prefill chunks run between included)."""
        if request_id not in self._decoding or tokens <= 0 or seconds <= 0:
            return
        self._decoded[request_id] = self._decoded.get(request_id, 0) + tokens
        self._token_at = self._clock()
        self._decode.observe(tokens * max(1, self._admitted.streams), seconds)

    def _retire(self, request_id: str, finished: bool) -> None:
        if request_id not in self._queued and not (finished and request_id in self._decoding):
            return
        served = self._dequeue(request_id, first_token=not finished)
        if finished:
            served += self._decoding.pop(request_id, AdmittedWork())
            self._decoded.pop(request_id, None)
        self._update(self._admitted - served)

    def _dequeue(self, request_id: str, first_token: bool) -> AdmittedWork:
        """Its prompt, nothing when it is past its first token. A first token is the queue draining: its
        prompt tokens over the time since the previous one feed the prefill rate."""
        if request_id not in self._queued:
            return AdmittedWork()
        was_head = request_id == next(iter(self._queued))
        tokens = self._queued.pop(request_id)
        now = self._clock()
        if first_token:
            self._prefill.observe(tokens, now - self._drained_at)
            self._measured.observe(tokens, now - self._drained_at)
            self._drained_at = self._token_at = now
        if was_head:
            self._head_since = now
        return AdmittedWork(tokens, prompts=1)

    def _update(self, admitted: AdmittedWork) -> None:
        self._admitted = admitted
        for listener in self._listeners:
            listener()
