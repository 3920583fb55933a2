"""Role-switch latency for `agentserve bench disagg`: seconds from `set_role` to the worker applying it
(clock-offset corrected, `WorkerEngine.role_switches`), on idle workers and on busy ones. A worker
takes a `SetRole` between two steps, so on a busy worker the latency includes the rest of its current
step: a decode step, or a prefill chunk."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.sampling.sampler import SamplingParams
from engine.workers import messages as m
from engine.workers.coordinator.worker_engine import WorkerEngine

SWITCH_TIMEOUT_S = 10.0
BUSY_TIMEOUT_S = 30.0  # to get every worker busy before a swap
BUSY_PREFILLS = 2  # long prefills kept in flight while the roles swap


@dataclass(frozen=True)
class SwitchLatencies:
    idle_s: list[float]
    busy_s: list[float]
    busy_in_flight: list[tuple[int, ...]]  # per busy swap: requests in flight on each worker when it was asked


def in_flight(engine: WorkerEngine) -> tuple[int, ...]:
    """Requests the coordinator has on each worker, counted only for workers whose last load report says
    they are running something (0 otherwise): a worker is busy when its count is above 0."""
    counts = [0] * len(engine.workers)
    for tracked in engine.tracked.values():
        for worker_id in tracked.worker_ids:
            counts[worker_id] += 1
    return tuple(count if engine.workers[index].stats.running else 0 for index, count in enumerate(counts))


def swap_roles(engine: WorkerEngine, keep_busy: Callable[[], None]) -> list[float]:
    """Ask every worker to take the other role, step until each applied it; their latencies."""
    before = len(engine.role_switches)
    for worker in engine.workers:
        engine.set_role(worker.worker_id, m.DECODE if worker.role == m.PREFILL else m.PREFILL)
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while len(engine.role_switches) < before + len(engine.workers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"a role switch was not applied within {SWITCH_TIMEOUT_S:.0f} s")
        engine.step()
        keep_busy()
    return engine.role_switches[before:]


def idle_switch_latencies(engine: WorkerEngine, swaps: int) -> list[float]:
    """Swaps while no worker holds a request."""
    if engine.has_unfinished():
        raise ValueError("idle role switches need an engine with nothing in flight")
    return [latency for _ in range(swaps) for latency in swap_roles(engine, lambda: None)]


@dataclass(frozen=True)
class BusyShape:
    decodes: int  # decode streams kept in flight
    decode_prompt: int
    decode_tokens: int
    prefill_prompt: int  # tokens of each long prefill (BUSY_PREFILLS kept in flight)
    seed: int


class BusyLoad:
    """Keeps the shape's decode streams and long prefills in flight, wherever the roles put them. Every
    prompt is fresh, so no prefill finds its tokens in a prefix cache."""

    def __init__(self, engine: WorkerEngine, shape: BusyShape) -> None:
        self.engine, self.shape, self.rng = engine, shape, random.Random(shape.seed)
        self.decode_params = SamplingParams(temperature=0, max_tokens=shape.decode_tokens, ignore_eos=True)
        self.prefill_params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        self.decodes: set[str] = set()
        self.prefills: set[str] = set()

    def top_up(self) -> None:
        self.decodes &= self.engine.tracked.keys()
        self.prefills &= self.engine.tracked.keys()
        while len(self.decodes) < self.shape.decodes:
            prompt = random_prompt(self.rng, self.shape.decode_prompt)
            self.decodes.add(self.engine.add_request(prompt, self.decode_params))
        while len(self.prefills) < BUSY_PREFILLS:
            prompt = random_prompt(self.rng, self.shape.prefill_prompt)
            self.prefills.add(self.engine.add_request(prompt, self.prefill_params))


def busy_switch_latencies(engine: WorkerEngine, load: BusyLoad, swaps: int
                          ) -> tuple[list[float], list[tuple[int, ...]]]:
    """Swaps each asked once every worker is busy; the latencies, and the requests in flight at each ask.
    The load is drained afterwards."""
    latencies: list[float] = []
    asked_with: list[tuple[int, ...]] = []
    for _ in range(swaps):
        asked_with.append(_until_busy(engine, load))
        latencies += swap_roles(engine, load.top_up)
    while engine.has_unfinished():
        engine.step()
    return latencies, asked_with


def _until_busy(engine: WorkerEngine, load: BusyLoad) -> tuple[int, ...]:
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    load.top_up()
    while not all(counts := in_flight(engine)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers were not all busy within {BUSY_TIMEOUT_S:.0f} s: {counts}")
        engine.step()
        load.top_up()
    return counts


def measure_switches(engine: WorkerEngine, load: BusyLoad, swaps: int) -> SwitchLatencies:
    idle = idle_switch_latencies(engine, swaps)
    busy, asked_with = busy_switch_latencies(engine, load, swaps)
    return SwitchLatencies(idle, busy, asked_with)


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [1] + [rng.randrange(5, 4000) for _ in range(length - 1)]
