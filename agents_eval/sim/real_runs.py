"""Real CPU runs to validate the simulator against: agent sessions played in real time through the engine
(`LLMEngine`, or the disaggregated engine's worker processes), every reply `max_tokens` long with ignore_eos,
TTFT and TPOT taken per request as the simulator takes them: TTFT from the turn's planned arrival (its session's
start, or its last reply plus the tool gap), so the rest of a step it fell due in counts, as it does simulated."""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents_eval.sim.workload import SimSession
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef

POLL_S = 0.002  # a worker-process engine's step waits at most this for its workers' outputs
Step = Callable[[float], list[Any]]  # one engine step, waiting for outputs at most the given seconds


def in_process(engine: Any) -> Step:
    """The in-process engine's step: it computes, it never waits (a turn due mid-step waits out the step)."""
    return lambda _wait_s: engine.step()


def through_processes(engine: Any) -> Step:
    """A worker-process engine's step: it waits for its workers' outputs, but not past the next turn's arrival (a
    driver that looked late would add its lateness to that turn's TTFT, a hop no serving process pays)."""
    return lambda wait_s: engine.step(timeout_s=min(POLL_S, wait_s))


@dataclass
class _Live:
    session: int
    prompt: list[int]
    arrival: float
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def play(engine: Any, sessions: list[SimSession], vocab: int, ttl_s: float, step: Step, seed: int = 0
         ) -> list[tuple[float, float]]:
    """(TTFT, TPOT) of every request, in seconds of wall time. `step`: `in_process` or `through_processes`."""
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(max((s.system_tokens for s in sessions), default=0))]
    histories = [system[:s.system_tokens] for s in sessions]
    next_turn = [0] * len(sessions)
    due = [(s.start_s, index) for index, s in enumerate(sessions)]
    heapq.heapify(due)
    live: dict[str, _Live] = {}
    results: list[tuple[float, float]] = []
    start = time.monotonic()
    while due or live:
        now = time.monotonic() - start
        while due and due[0][0] <= now:
            at, index = heapq.heappop(due)
            turn = sessions[index].turns[next_turn[index]]
            prompt = histories[index] + [rng.randrange(3, vocab) for _ in range(turn.new_tokens)]
            params = SamplingParams(max_tokens=turn.output_tokens, temperature=0.0, ignore_eos=True)
            request_id = engine.add_request(prompt, params, session=SessionRef(sessions[index].session_id, ttl_s))
            live[request_id] = _Live(index, prompt, at)  # planned: a turn due mid-step waits out the step
        if not engine.has_unfinished():
            time.sleep(min(0.01, max(0.0, due[0][0] - now)) if due else 0.0)
            continue
        for out in step(max(0.0, due[0][0] - (time.monotonic() - start)) if due else POLL_S):
            request = live[out.request_id]
            request.times += [time.monotonic() - start] * len(out.new_token_ids)
            request.tokens += out.new_token_ids
            if out.finished:
                del live[out.request_id]
                results.append(_latencies(request))
                _next(sessions, request, histories, next_turn, due)
    return results


def _latencies(request: _Live) -> tuple[float, float]:
    ttft = request.times[0] - request.arrival
    tpot = (request.times[-1] - request.times[0]) / (len(request.times) - 1) if len(request.times) > 1 else 0.0
    return ttft, tpot


def _next(sessions: list[SimSession], request: _Live, histories: list[list[int]], next_turn: list[int],
          due: list[tuple[float, int]]) -> None:
    index = request.session
    histories[index] = request.prompt + request.tokens
    next_turn[index] += 1
    if next_turn[index] < len(sessions[index].turns):
        gap = sessions[index].turns[next_turn[index]].gap_s
        heapq.heappush(due, (request.times[-1] + gap, index))
