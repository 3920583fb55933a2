"""The capacity loop follows a think/act swing within 500 ms on its own clock. Turns go through the gateway's
admission ledger, whose admitted work reaches the loop as the gateway sends it, and are served on a simulated
clock (fixed times to first token and to the end), so every decision is deterministic. A fifth of each phase's
turns belong to the other phase: the split must follow the phase, not its minority turns."""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from engine.capacity.loop import CapacityLoop
from engine.capacity.routing import prefill_locally
from engine.capacity.settings import CapacitySettings
from engine.core.stats import AgentSignals
from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle
from gateway.admission import AdmissionController

BOUND_S = 0.5
PHASE_S, TURN_EVERY_S, MINORITY_EVERY = 6.0, 0.125, 5
PHASES = ("act", "think", "act", "think")
ROLE_OF = {"think": m.PREFILL, "act": m.DECODE}
START = 100.0  # the loop's clock at the first turn


@dataclass(frozen=True)
class Turn:
    prompt_tokens: int
    output_tokens: int
    first_token_s: float  # after admission
    done_s: float


TURNS = {"think": Turn(6000, 16, 0.4, 0.7), "act": Turn(32, 400, 0.05, 4.0)}


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


class Swing:
    """Four workers (two per role at the start) under the capacity loop, fed by an admission ledger."""

    def __init__(self, report_admitted: bool = True, place: bool = True) -> None:
        self.clock, self.place = Clock(), place
        self.workers = [WorkerHandle(i, m.PREFILL if i < 2 else m.DECODE, None, None)  # type: ignore[arg-type]
                        for i in range(4)]  # no process: the loop only reads and re-roles them
        self.loop = CapacityLoop(CapacitySettings(), self.workers, self.set_role)
        self.ledger = AdmissionController(ttft_slo_s=3600.0, initial_prefill_tokens_per_s=1.0, clock=self.clock)
        if report_admitted:
            self.ledger.subscribe(self.send_admitted)
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()

    def first_token(self, request_id: str) -> None:
        self.loop.routed.done(request_id)
        self.ledger.on_first_token(request_id)

    def set_role(self, worker_id: int, role: str) -> None:
        self.workers[worker_id].role = role
        self.workers[worker_id].switched_at = self.clock.now

    def send_admitted(self) -> None:
        signals = AgentSignals(admitted=self.ledger.admitted, admitted_total=self.ledger.admitted_total)
        self.loop.update_signals(signals, self.clock.now)

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (when, next(self.order), action))

    def admit(self, request_id: str, turn: Turn) -> None:
        """Admitted, then placed by the coordinator: a fresh prompt, all uncached, through the router's gate."""
        self.ledger.on_admit(request_id, turn.prompt_tokens, turn.output_tokens)
        if self.place:
            gated = not prefill_locally(turn.prompt_tokens, turn.prompt_tokens, self.loop.settings)
            self.loop.routed.placed(request_id, turn.prompt_tokens, gated)
        self.at(self.clock.now + turn.first_token_s, lambda: self.first_token(request_id))
        self.at(self.clock.now + turn.done_s, lambda: self.ledger.on_finish(request_id))

    def run(self) -> None:
        for index, phase in enumerate(PHASES):
            for k in range(int(PHASE_S / TURN_EVERY_S)):
                kind = phase if k % MINORITY_EVERY else ("act" if phase == "think" else "think")
                when = START + index * PHASE_S + k * TURN_EVERY_S
                self.at(when, functools.partial(self.admit, f"{index}-{k}", TURNS[kind]))
        for tick in range(int(len(PHASES) * PHASE_S / self.loop.settings.interval_s) + 1):
            self.at(START + tick * self.loop.settings.interval_s, lambda: self.loop.tick(self.clock.now))
        while self.queue:
            self.clock.now, _, action = heapq.heappop(self.queue)
            action()

    def moves(self, start: float, end: float) -> list[tuple[float, str]]:
        return [(e.at, str(e.detail["role"])) for e in self.loop.events.events
                if e.kind == "move" and start <= e.at < end]


def test_the_split_follows_each_shift_within_the_bound_and_not_its_minority_turns() -> None:
    swing = Swing()
    swing.run()
    for index, phase in enumerate(PHASES):
        start, role = START + index * PHASE_S, ROLE_OF[phase]
        moves = swing.moves(start, start + PHASE_S)
        assert {r for _, r in moves} == {role}, f"{phase} phase: moves against it or none: {moves}"
        if index > 0:  # a shift: the first phase starts from an idle engine
            assert moves[0][0] - start <= BOUND_S, f"{phase} phase served {moves[0][0] - start:.3f} s after its start"
    final = [w.role for w in swing.workers]
    assert final.count(m.PREFILL) == 3, "the think phase ends on 3 prefill workers, 1 decode"
    assert swing.loop.moves == len(swing.moves(START, START + len(PHASES) * PHASE_S))
    assert swing.ledger.admitted.streams == 0 and swing.loop.signals.admitted == swing.ledger.admitted


def test_without_the_admitted_work_the_loop_reads_the_queues() -> None:
    """Idle workers report empty queues: no admitted work, no demand, no move."""
    swing = Swing(report_admitted=False, place=False)
    swing.run()
    assert swing.loop.moves == 0 and swing.loop.signals.admitted is None
