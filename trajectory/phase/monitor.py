"""The global think/act mix over all sessions, and CUSUM detection of its shifts."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trajectory.phase.classifier import (
    DetectorConfig,
    MixConfig,
    MixSample,
    PhaseConfig,
    PhaseEstimate,
    PhaseShiftEvent,
)

NEUTRAL_THINK_SHARE = 0.5
MIN_VARIANCE = 0.05 * 0.95
MAX_EVENTS = 256  # shift events kept in `PhaseMixMonitor.events`; older ones are dropped

Clock = Callable[[], float]
ShiftSubscriber = Callable[[PhaseShiftEvent], None]


@dataclass
class _Side:
    """One side of a two-sided CUSUM, and the samples since its sum last left zero (the change point)."""

    direction: Literal["to_think", "to_act"]
    sign: float
    total: float = 0.0
    run_start: float = 0.0
    run_sum: float = 0.0
    run_count: int = 0

    def step(self, deviation: float, slack: float, sample: float, now: float) -> None:
        self.total = max(0.0, self.total + self.sign * deviation - slack)
        if self.total == 0.0:
            self.run_count = 0
            return
        if self.run_count == 0:
            self.run_start, self.run_sum = now, 0.0
        self.run_sum += sample
        self.run_count += 1

    def reset(self) -> None:
        self.total, self.run_count = 0.0, 0

    @property
    def run_mean(self) -> float:
        return self.run_sum / self.run_count


class ShiftDetector:
    """Two-sided CUSUM over per-turn think samples x in [0, 1] (a turn's P(think)), in standard deviations.

    The baseline m is the running mean of the first `warmup_turns` samples, then an EWMA with `baseline_alpha`;
    s = sqrt(max(m (1 - m), 0.05 * 0.95)) is the spread of a Bernoulli mix with share m. With z = (x - m) / s
    and slack k = min_shift / (2 s):

        S_think = max(0, S_think + z - k)        S_act = max(0, S_act - z - k)

    Measuring in s keeps the false-event rate alike for a 50/50 and a 90/10 mix. A side whose S exceeds
    `threshold` emits an event. Then both sums reset, the baseline restarts from the samples since that side
    last left zero (the change-point estimate), and no event fires for `refractory_s` nor before the
    baseline again holds `warmup_turns` samples: one shift gives one event.
    """

    def __init__(self, config: DetectorConfig) -> None:
        self._config = config
        self._baseline = NEUTRAL_THINK_SHARE
        self._baseline_count = 0
        self._last_event_at: float | None = None
        self._sides = (_Side("to_think", 1.0), _Side("to_act", -1.0))

    def update(self, sample: float, now: float) -> PhaseShiftEvent | None:
        if self._baseline_count >= self._config.warmup_turns and not self._in_refractory(now):
            spread = self._spread()
            for side in self._sides:
                side.step((sample - self._baseline) / spread, self._config.min_shift / (2 * spread), sample, now)
        event = self._event(now)
        if event is None:
            self._track_baseline(sample)
        return event

    def _spread(self) -> float:
        return math.sqrt(max(self._baseline * (1.0 - self._baseline), MIN_VARIANCE))

    def _in_refractory(self, now: float) -> bool:
        return self._last_event_at is not None and now - self._last_event_at < self._config.refractory_s

    def _track_baseline(self, sample: float) -> None:
        self._baseline_count += 1
        alpha = max(1.0 / self._baseline_count, self._config.baseline_alpha)
        self._baseline += alpha * (sample - self._baseline)

    def _event(self, now: float) -> PhaseShiftEvent | None:
        crossed = [side for side in self._sides if side.total > self._config.threshold]
        if not crossed:
            return None
        side = max(crossed, key=lambda s: s.total)
        event = PhaseShiftEvent(timestamp=now, direction=side.direction, think_share_before=self._baseline,
                                think_share_after=side.run_mean, detection_delay_hint=now - side.run_start)
        self._restart_after(side, now)
        return event

    def _restart_after(self, side: _Side, now: float) -> None:
        self._baseline, self._baseline_count = side.run_mean, side.run_count
        self._last_event_at = now
        for each in self._sides:
            each.reset()


@dataclass(frozen=True)
class _WindowTurn:
    at: float
    think_probability: float
    prefill_tokens: int


class PhaseMixMonitor:
    """The think/act mix of all sessions over a sliding window of `mix.window_s` seconds.

    `mix(now).think_share` = (1 - load_weight) * turn_share + load_weight * load_share, where

        turn_share = mean P(think) of the turns in the window (the share of think turns, each turn counted
                     by the classifier's probability that it is a think turn), and
        load_share = prefill_tokens_per_s / (prefill_tokens_per_s + active_decodes * decode_stream_cost),
                     `decode_stream_cost_tokens_per_s` being the prefill rate that costs a worker as much as
                     one decode stream.

    Without turns in the window think_share is load_share alone; without turns or load it is 0.5.
    Every observed turn also feeds its P(think) to a `ShiftDetector`; its events land in `events` (the latest
    `MAX_EVENTS`) and go to the subscribers.
    """

    def __init__(self, config: PhaseConfig, clock: Clock = time.monotonic) -> None:
        self._mix_config: MixConfig = config.mix
        self._clock = clock
        self._detector = ShiftDetector(config.detector)
        self._window: deque[_WindowTurn] = deque()
        self._window_prefill_tokens = 0
        self._active_decodes: Counter[str] = Counter()
        self._subscribers: list[ShiftSubscriber] = []
        self.events: list[PhaseShiftEvent] = []

    def subscribe(self, callback: ShiftSubscriber) -> None:
        self._subscribers.append(callback)

    def observe_turn(self, session_id: str, estimate: PhaseEstimate, prefill_tokens: int,
                     now: float | None = None) -> PhaseShiftEvent | None:
        """Record a turn of `session_id` (classified as `estimate`, needing `prefill_tokens` of prefill)."""
        at = self._now(now)
        self._window.append(_WindowTurn(at, estimate.think_probability, prefill_tokens))
        self._window_prefill_tokens += prefill_tokens
        self._expire(at)
        event = self._detector.update(estimate.think_probability, at)
        if event is not None:
            self._publish(event)
        return event

    def decode_started(self, session_id: str, now: float | None = None) -> None:
        self._expire(self._now(now))
        self._active_decodes[session_id] += 1

    def decode_finished(self, session_id: str, now: float | None = None) -> None:
        """End one decode stream of `session_id`; a session without one is left as it is."""
        self._expire(self._now(now))
        if self._active_decodes[session_id] <= 1:
            del self._active_decodes[session_id]
        else:
            self._active_decodes[session_id] -= 1

    def mix(self, now: float | None = None) -> MixSample:
        self._expire(self._now(now))
        prefill_rate = self._window_prefill_tokens / self._mix_config.window_s
        active = self._active_decodes.total()
        return MixSample(think_share=self._think_share(prefill_rate, active), prefill_tokens_per_s=prefill_rate,
                         active_decodes=active, turns_in_window=len(self._window))

    def _think_share(self, prefill_rate: float, active_decodes: int) -> float:
        load = prefill_rate + active_decodes * self._mix_config.decode_stream_cost_tokens_per_s
        load_share = prefill_rate / load if load > 0 else None
        if not self._window:
            return NEUTRAL_THINK_SHARE if load_share is None else load_share
        turn_share = sum(turn.think_probability for turn in self._window) / len(self._window)
        if load_share is None:
            return min(1.0, turn_share)
        weight = self._mix_config.load_weight
        return min(1.0, (1.0 - weight) * turn_share + weight * load_share)

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _expire(self, now: float) -> None:
        horizon = now - self._mix_config.window_s
        while self._window and self._window[0].at <= horizon:
            self._window_prefill_tokens -= self._window.popleft().prefill_tokens
        if not self._window:
            self._window_prefill_tokens = 0

    def _publish(self, event: PhaseShiftEvent) -> None:
        self.events.append(event)
        del self.events[:-MAX_EVENTS]
        for callback in self._subscribers:
            callback(event)
