"""Agent sessions as token counts: what the simulator replays. From a `Workload` of `agents_eval.workloads`,
or drawn straight from one of its session shapes (swe, webarena) without the prompt text, which at a
simulated hour's hundred thousand turns would cost more to write than to simulate. The draws follow
`agents_eval.workloads.synthetic` (same seeds, same order), so a shape's sizes are the workload's. The sharegpt
shape (`agents_eval.workloads.sharegpt`, DistServe's chatbot requests) exists only here, as sizes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from agents_eval.workloads.arrivals import poisson_starts
from agents_eval.workloads.sharegpt import ShareGptShape
from agents_eval.workloads.swe import SweShape
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.synthetic import SessionShape
from agents_eval.workloads.types import APPEND, Workload
from agents_eval.workloads.webarena import WebArenaShape

SHAPES: dict[str, SessionShape] = {"swe": SweShape(), "webarena": WebArenaShape(), "sharegpt": ShareGptShape()}


class PhaseDraw(Protocol):
    """What decides a turn's phase from its planned arrival: a `Swing`, or the swing run's plan (`sim.swing`)."""

    def draw(self, rng: random.Random, at_s: float) -> str: ...


@dataclass(frozen=True)
class SimTurn:
    gap_s: float  # after the previous reply
    new_tokens: int
    output_tokens: int
    phase: str


@dataclass(frozen=True)
class SimSession:
    session_id: str
    start_s: float
    system_tokens: int
    history: str  # APPEND or LAST_ACTION
    turns: tuple[SimTurn, ...]


def from_workload(workload: Workload) -> list[SimSession]:
    return [SimSession(s.session_id, s.start_s, s.system_tokens, s.turns[0].history if s.turns else APPEND,
                       tuple(SimTurn(t.tool_gap_s, t.new_tokens, t.max_output_tokens, t.phase) for t in s.turns))
            for s in workload.sessions]


def draw_sessions(name: str, *, seed: int, rate: float, duration_s: float, length_scale: float = 1.0,
                  swing: Swing | None = None, max_context: int | None = None) -> list[SimSession]:
    """Sessions of shape `name` starting at `rate` per second for `duration_s`; a session stops before the turn
    whose prompt would pass `max_context` tokens."""
    starts = poisson_starts(random.Random(seed), rate, duration_s, None)
    return sessions_at(name, starts, seed=seed, length_scale=length_scale, swing=swing or Swing(),
                       max_context=max_context)


def sessions_at(name: str, starts: Sequence[float], *, seed: int, swing: PhaseDraw, length_scale: float = 1.0,
                max_context: int | None = None) -> list[SimSession]:
    """Sessions of shape `name` starting at `starts`, each turn's phase drawn by `swing`."""
    shape = SHAPES[name]
    return [_session(shape, seed, index, start, length_scale, swing, max_context)
            for index, start in enumerate(starts)]


def _session(shape: SessionShape, seed: int, index: int, start: float, length_scale: float, swing: PhaseDraw,
             max_context: int | None) -> SimSession:
    rng = random.Random(f"{seed}:{shape.name}:{index}")
    system = shape.system_tokens(length_scale)
    turns: list[SimTurn] = []
    at, context = start, system
    for step in range(shape.turn_count(rng)):
        gap = shape.gaps.draw(rng) if step else 0.0
        at += (1.0 + gap) if step else 0.0  # synthetic's assumed_reply_s of 1 s
        phase = swing.draw(rng, at)
        new_tokens, output_tokens = shape.turn_sizes(rng, phase, length_scale)
        context = (context if shape.history == APPEND else system + (turns[-1].output_tokens if turns else 0))
        context += new_tokens
        if max_context is not None and context + output_tokens > max_context:
            break
        context += output_tokens
        turns.append(SimTurn(gap, new_tokens, output_tokens, phase))
    return SimSession(f"{shape.name}-{seed}-{index:05d}", start, system, shape.history, tuple(turns))
