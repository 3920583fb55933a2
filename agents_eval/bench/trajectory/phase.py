"""Think/act phase-shift detection on scripted swings, on a simulated clock.

Many sessions take turns at random intervals; in each regime a turn is a think turn (a large new
observation, long outputs) with the regime's probability, else an act turn (a small delta, a short tool
call). Every turn goes through `classify_turn` and `PhaseMixMonitor.observe_turn`. A regime change is
detected by the first event in the new regime with the right direction; its delay runs from the first turn
of that regime. Every other event is a false one.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import mean
from typing import Any

from trajectory.phase.classifier import Phase, PhaseConfig, PhaseShiftEvent, TurnFeatures, classify_turn
from trajectory.phase.monitor import PhaseMixMonitor

Advance = Callable[[int], None]

THINK_DELTA_TOKENS = (400, 3000)
ACT_DELTA_TOKENS = (10, 150)
THINK_OUTPUT_TOKENS = (150, 600)
ACT_OUTPUT_TOKENS = (8, 40)
TURN_GAP_S = (0.5, 1.5)
RECENT_OUTPUTS = 4


@dataclass(frozen=True)
class PhaseScript:
    sessions: int = 64
    segment_s: float = 30.0
    think_shares: tuple[float, ...] = (0.8, 0.2, 0.8)  # share of think turns per regime, in order

    @property
    def duration_s(self) -> float:
        return self.segment_s * len(self.think_shares)

    def regime(self, now: float) -> int:
        return min(int(now // self.segment_s), len(self.think_shares) - 1)


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Detection:
    regime: int
    direction: str
    first_turn_s: float  # the first turn of the new regime
    detected_s: float | None = None

    @property
    def delay_s(self) -> float | None:
        return None if self.detected_s is None else self.detected_s - self.first_turn_s


@dataclass
class PhaseFigures:
    script: PhaseScript
    turns: int
    detections: list[Detection]
    events: list[PhaseShiftEvent]
    false_events: list[PhaseShiftEvent] = field(default_factory=list)

    @property
    def delays_s(self) -> list[float]:
        return [d.delay_s for d in self.detections if d.delay_s is not None]

    def to_json(self) -> dict[str, Any]:
        delays = self.delays_s
        return {"script": asdict(self.script), "turns": self.turns,
                "events": [asdict(event) for event in self.events],
                "detections": [asdict(d) | {"delay_s": d.delay_s} for d in self.detections],
                "missed": sum(d.detected_s is None for d in self.detections),
                "false_events": len(self.false_events),
                "delay_mean_s": mean(delays) if delays else None, "delay_max_s": max(delays, default=None)}


def _features(think: bool, outputs: list[int], rng: random.Random) -> TurnFeatures:
    delta = rng.randint(*(THINK_DELTA_TOKENS if think else ACT_DELTA_TOKENS))
    return TurnFeatures(delta, tuple(outputs[-RECENT_OUTPUTS:]), last_turn_had_tool_calls=True,
                        new_roles=("tool",), tools_available=True)


def _simulate(script: PhaseScript, monitor: PhaseMixMonitor, clock: SimulatedClock, config: PhaseConfig,
              rng: random.Random) -> tuple[int, dict[int, float]]:
    """All turns in time order; returns the number of turns and each regime's first turn time."""
    queue = [(rng.uniform(*TURN_GAP_S), session) for session in range(script.sessions)]
    heapq.heapify(queue)
    outputs: list[list[int]] = [[] for _ in range(script.sessions)]
    first_turns: dict[int, float] = {}
    turns = 0
    while queue[0][0] < script.duration_s:
        clock.now, session = heapq.heappop(queue)
        regime = script.regime(clock.now)
        first_turns.setdefault(regime, clock.now)
        think = rng.random() < script.think_shares[regime]
        features = _features(think, outputs[session], rng)
        estimate = classify_turn(features, config)
        monitor.observe_turn(f"s{session}", estimate, features.delta_tokens)
        outputs[session].append(rng.randint(*(THINK_OUTPUT_TOKENS if think else ACT_OUTPUT_TOKENS)))
        heapq.heappush(queue, (clock.now + rng.uniform(*TURN_GAP_S), session))
        turns += 1
    return turns, first_turns


def _detections(script: PhaseScript, first_turns: dict[int, float],
                events: list[PhaseShiftEvent]) -> tuple[list[Detection], list[PhaseShiftEvent]]:
    detections, matched = [], set()
    for regime in range(1, len(script.think_shares)):
        rising = script.think_shares[regime] > script.think_shares[regime - 1]
        detection = Detection(regime, "to_think" if rising else "to_act", first_turns[regime])
        end = (regime + 1) * script.segment_s if regime + 1 < len(script.think_shares) else float("inf")
        found = next((i for i, e in enumerate(events) if detection.first_turn_s <= e.timestamp < end
                      and e.direction == detection.direction), None)
        if found is not None:
            detection.detected_s = events[found].timestamp
            matched.add(found)
        detections.append(detection)
    return detections, [event for i, event in enumerate(events) if i not in matched]


def run_phase_swings(script: PhaseScript, config: PhaseConfig, seed: int, advance: Advance) -> PhaseFigures:
    clock = SimulatedClock()
    monitor = PhaseMixMonitor(config, clock=clock)
    turns, first_turns = _simulate(script, monitor, clock, config, random.Random(f"{seed}:phase"))
    advance(len(script.think_shares))
    detections, false_events = _detections(script, first_turns, monitor.events)
    return PhaseFigures(script, turns, detections, list(monitor.events), false_events)


def think_label(share: float) -> str:
    """A regime's name, e.g. '80% think'."""
    return f"{share:.0%} {Phase.THINK.value}" if share >= 0.5 else f"{1 - share:.0%} {Phase.ACT.value}"
