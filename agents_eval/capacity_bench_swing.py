"""One swinging run for the capacity benchmark: open-loop requests whose think/act mix flips every
`period_s` (80% think in think windows, 80% act in act windows), driven straight into a disaggregated
engine. Each turn is classified and fed to the same phase monitor the gateway uses; its shift events
and mix go to the engine as the gateway sends them. Records per-request latencies and, for every window
boundary, when the shift was detected, when the controller moved a worker and when the move applied."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.sampling import SamplingParams
from engine.stats import AgentSignals
from engine.worker.coordinator import DisaggregatedEngine
from engine.worker.deployment import DeploymentSettings
from gateway.load_signals import SHIFT_PHASE
from trajectory.phase import PhaseConfig, PhaseShiftEvent, TurnFeatures, classify_turn
from trajectory.phase_monitor import PhaseMixMonitor


@dataclass(frozen=True)
class SwingWorkload:
    duration_s: float = 60.0
    period_s: float = 15.0  # each window's length; the first window is act
    rate: float = 4.0  # requests per second, Poisson
    majority: float = 0.8  # share of a window's turns in its phase
    think_prompt: int = 1536  # a large observation: the phase classifier calls it think
    think_output: int = 32
    act_prompt: int = 16  # a short tool result, a longer latency-bound reply
    act_output: int = 64
    seed: int = 0

    def window_phase(self, t: float) -> str:
        return "act" if int(t // self.period_s) % 2 == 0 else "think"

    def arrivals(self) -> list[tuple[float, str]]:
        rng, t = random.Random(self.seed), 0.0
        out: list[tuple[float, str]] = []
        while True:
            t += rng.expovariate(self.rate)
            if t >= self.duration_s:
                return out
            window = self.window_phase(t)
            other = "think" if window == "act" else "act"
            out.append((t, window if rng.random() < self.majority else other))


@dataclass
class RunResult:
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    window_starts: list[tuple[float, str]] = field(default_factory=list)  # (seconds from start, phase)
    shifts: list[tuple[float, str]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # the controller's, times from start
    # (seconds from start, prefill workers, think share)
    timeline: list[tuple[float, int, float]] = field(default_factory=list)
    requests: int = 0
    finished: int = 0


@dataclass
class _Live:
    submitted: float
    first: float | None = None
    tokens: int = 0


def run_swing(model: str, workload: SwingWorkload, split: tuple[int, int], capacity: CapacitySettings,
              progress: Callable[[int], None] = lambda n: None) -> RunResult:
    engine = DisaggregatedEngine(model, EngineSettings(), DeploymentSettings(prefill=split[0], decode=split[1]),
                                 capacity)
    try:
        return _drive(engine, workload, progress)
    finally:
        engine.shutdown()


def _drive(engine: DisaggregatedEngine, workload: SwingWorkload, progress: Callable[[int], None]) -> RunResult:
    config, rng = PhaseConfig.load(), random.Random(workload.seed + 1)
    monitor, result, live = PhaseMixMonitor(config), RunResult(), {}
    pending = workload.arrivals()
    result.requests = len(pending)
    start = time.monotonic()
    monitor.subscribe(lambda event: _on_shift(engine, monitor, result, event, start))
    last_push, recent = start, [workload.act_output] * 3
    while pending or engine.has_unfinished():
        now = time.monotonic()
        while pending and pending[0][0] <= now - start:
            at, phase = pending.pop(0)
            _window_boundary(result, workload, at)
            request_id = f"r{result.requests - len(pending)}"
            prompt_len = workload.think_prompt if phase == "think" else workload.act_prompt
            output = workload.think_output if phase == "think" else workload.act_output
            features = TurnFeatures(prompt_len, tuple(recent), new_roles=("tool",))
            monitor.observe_turn(request_id, classify_turn(features, config), prompt_len)
            recent = [*recent[1:], output]
            prompt = [1] + [rng.randrange(3, 4000) for _ in range(prompt_len - 1)]
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=output, ignore_eos=True), request_id)
            live[request_id] = _Live(time.monotonic())
        for out in engine.step(0.002):
            _record(live, result, out.request_id, len(out.new_token_ids), out.finished, progress)
        if now - last_push >= engine.capacity.settings.interval_s:
            mix = monitor.mix(now).think_share
            shift = result.shifts[-1] if result.shifts else None
            engine.update_signals(AgentSignals(mix, shift[1] if shift else None,
                                               start + shift[0] if shift else None))
            result.timeline.append((now - start, sum(w.role == "prefill" for w in engine.workers), mix))
            last_push = now
    result.events = [{**event.detail, "kind": event.kind, "at": event.at - start}
                     for event in engine.capacity.events.events]
    return result


def _window_boundary(result: RunResult, workload: SwingWorkload, at: float) -> None:
    phase = workload.window_phase(at)
    if not result.window_starts or result.window_starts[-1][1] != phase:
        result.window_starts.append((at, phase))


def _on_shift(engine: DisaggregatedEngine, monitor: PhaseMixMonitor, result: RunResult,
              event: PhaseShiftEvent, start: float) -> None:
    phase = SHIFT_PHASE[event.direction]
    result.shifts.append((event.timestamp - start, phase))
    engine.update_signals(AgentSignals(monitor.mix(event.timestamp).think_share, phase, event.timestamp))


def _record(live: dict[str, _Live], result: RunResult, request_id: str, new: int, finished: bool,
            progress: Callable[[int], None]) -> None:
    request = live[request_id]
    now = time.monotonic()
    if new and request.first is None:
        request.first = now
        result.ttft_s.append(now - request.submitted)
    request.tokens += new
    if finished:
        del live[request_id]
        result.finished += 1
        progress(1)
        if request.first is not None and request.tokens > 1:
            result.tpot_s.append((now - request.first) / (request.tokens - 1))
