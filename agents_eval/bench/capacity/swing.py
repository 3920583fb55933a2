"""One swinging run for the capacity benchmark: open-loop requests whose think/act mix flips every
`period_s` (80% think in think windows, 80% act in act windows), driven straight into a disaggregated
engine. Each turn goes through the gateway's admission ledger (its prompt and output tokens, retired at
its first token and at its end) and is classified and fed to the same phase monitor the gateway uses; the
admitted work, the shift events and the mix go to the engine as the gateway sends them. Records
per-request latencies, counted from each turn's planned arrival (a late submit counts against the run),
and for every window boundary when the shift was detected, when the controller moved a worker and when
the move applied."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.core.stats import AgentSignals
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from gateway.admission import AdmissionController
from gateway.load_signals import SHIFT_PHASE
from trajectory.phase.classifier import PhaseConfig, PhaseShiftEvent, TurnFeatures, classify_turn
from trajectory.phase.monitor import PhaseMixMonitor


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

    def sizes(self, phase: str) -> tuple[int, int]:
        """A turn's prompt and output tokens."""
        return (self.think_prompt, self.think_output) if phase == "think" else (self.act_prompt, self.act_output)

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
    arrival: float  # planned, on the monotonic clock
    first: float | None = None
    tokens: int = 0


class _GatewaySignals:
    """What the gateway tells the engine: the admitted work at every change of the ledger, shift events at
    once, and the mix with the latest shift every interval."""

    def __init__(self, engine: WorkerEngine, result: RunResult, start: float) -> None:
        self.engine, self.result, self.start = engine, result, start
        self.monitor = PhaseMixMonitor(PhaseConfig.load())
        self.admission = AdmissionController(ttft_slo_s=3600.0, initial_prefill_tokens_per_s=1.0)  # never refuses
        self.monitor.subscribe(self._on_shift)
        self.admission.subscribe(lambda: self.push(time.monotonic()))

    def push(self, now: float) -> None:
        shift = self.result.shifts[-1] if self.result.shifts else None
        self.engine.update_signals(AgentSignals(
            self.monitor.mix(now).think_share, shift[1] if shift else None, self.start + shift[0] if shift else None,
            admitted=self.admission.admitted, admitted_total=self.admission.admitted_total))

    def _on_shift(self, event: PhaseShiftEvent) -> None:
        self.result.shifts.append((event.timestamp - self.start, SHIFT_PHASE[event.direction]))
        self.push(event.timestamp)


def run_swing(model: str, workload: SwingWorkload, split: tuple[int, int], capacity: CapacitySettings,
              progress: Callable[[int], None] = lambda n: None) -> RunResult:
    engine = WorkerEngine(model, EngineSettings(), DeploymentSettings(prefill=split[0], decode=split[1]),
                                 capacity)
    try:
        return _drive(engine, workload, progress)
    finally:
        engine.shutdown()


def _drive(engine: WorkerEngine, workload: SwingWorkload, progress: Callable[[int], None]) -> RunResult:
    result, live = RunResult(), {}
    capacity = engine.capacity
    assert capacity is not None, "a swing runs with the capacity controller"
    pending = workload.arrivals()
    result.requests = len(pending)
    start = time.monotonic()
    signals, submit = _GatewaySignals(engine, result, start), _Submitter(workload)
    last_push = start
    while pending or engine.has_unfinished():
        now = time.monotonic()
        while pending and pending[0][0] <= now - start:
            at, phase = pending.pop(0)
            note_window(result, workload, at)
            request_id = f"r{result.requests - len(pending)}"
            submit(engine, signals, request_id, phase)
            live[request_id] = _Live(start + at)
        for out in engine.step(0.002):
            _record(signals.admission, live, result, out, time.monotonic(), progress)
        if now - last_push >= capacity.settings.interval_s:
            signals.push(now)
            result.timeline.append((now - start, sum(w.role == "prefill" for w in engine.workers),
                                    signals.monitor.mix(now).think_share))
            last_push = now
    result.events = [{**event.detail, "kind": event.kind, "at": event.at - start}
                     for event in capacity.events.events]
    return result


class _Submitter:
    """One turn as the gateway hands it over: classified and admitted first, then added to the engine."""

    def __init__(self, workload: SwingWorkload) -> None:
        self.workload, self.config, self.rng = workload, PhaseConfig.load(), random.Random(workload.seed + 1)
        self.recent = [workload.act_output] * 3

    def __call__(self, engine: WorkerEngine, signals: _GatewaySignals, request_id: str, phase: str) -> None:
        workload = self.workload
        prompt_len, output = workload.sizes(phase)
        features = TurnFeatures(prompt_len, tuple(self.recent), new_roles=("tool",))
        signals.monitor.observe_turn(request_id, classify_turn(features, self.config), prompt_len)
        self.recent = [*self.recent[1:], output]
        signals.admission.on_admit(request_id, prompt_len, output)
        prompt = [1] + [self.rng.randrange(3, 4000) for _ in range(prompt_len - 1)]
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=output, ignore_eos=True), request_id)


def note_window(result: RunResult, workload: SwingWorkload, at: float) -> None:
    """Record the start of a new think/act window at the arrival `at` (seconds from the start)."""
    phase = workload.window_phase(at)
    if not result.window_starts or result.window_starts[-1][1] != phase:
        result.window_starts.append((at, phase))


def _record(admission: AdmissionController, live: dict[str, _Live], result: RunResult, out: RequestOutput,
            now: float, progress: Callable[[int], None]) -> None:
    """One output at `now`: time to first token from the turn's planned arrival, TPOT after it; the ledger
    retires the turn's prompt at its first token and the rest at its end, as the gateway does."""
    request, new = live[out.request_id], len(out.new_token_ids)
    if new and request.first is None:
        request.first = now
        result.ttft_s.append(now - request.arrival)
        admission.on_first_token(out.request_id)
    request.tokens += new
    if out.finished:
        del live[out.request_id]
        admission.on_finish(out.request_id)
        result.finished += 1
        progress(1)
        if request.first is not None and request.tokens > 1:
            result.tpot_s.append((now - request.first) / (request.tokens - 1))
