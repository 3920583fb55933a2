"""The capacity controller running inside the disaggregated engine: every `interval_s`, and at once when the
gateway's admitted work changes (a turn admitted or served), on a phase shift or a hand-pinned split, it
builds a `LoadSnapshot` from the workers' Load reports and the gateway's agent signals, asks the policy for a
split, moves workers with `set_role`, and evaluates the inflection alerts. Its decisions, moves, confirmations,
shifts and alerts go to the event log that `GET /admin/capacity` shows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from engine.capacity.alerts import AlertInputs, AlertMonitor
from engine.capacity.events import EventLog, JsonValue
from engine.capacity.policy import CapacityPolicy, Decision
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, PREFILL, LoadSnapshot, RoutedPrefills, Shift, WorkerLoad, role_figures
from engine.core.stats import AgentSignals, EngineStats, ema, mean_line

log = logging.getLogger(__name__)
SetRole = Callable[[int, str], None]


class WorkerProcessId(Protocol):
    @property
    def pid(self) -> int | None: ...


class MovableWorker(Protocol):
    """What the loop reads of a worker it moves between roles (the coordinator's worker handle)."""

    @property
    def worker_id(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    @property
    def stats(self) -> EngineStats: ...
    @property
    def switched_at(self) -> float: ...
    @property
    def process(self) -> WorkerProcessId: ...


@dataclass
class RequestTimes:
    """EMAs over finished requests: time to first token (prefill latency) and the decode time after it."""

    alpha: float = 0.2
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def observe(self, prefill_s: float, decode_s: float) -> None:
        self.prefill_s = ema(self.prefill_s, prefill_s, self.alpha)
        self.decode_s = ema(self.decode_s, decode_s, self.alpha)


class CapacityLoop:
    def __init__(self, settings: CapacitySettings, workers: Sequence[MovableWorker], set_role: SetRole,
                 max_streams_per_worker: int | None = None) -> None:
        self.settings, self.workers, self.set_role = settings, workers, set_role
        self.max_streams_per_worker = max_streams_per_worker  # the engine's max_num_seqs
        self.policy = CapacityPolicy(settings)
        self.alerts = AlertMonitor(settings)
        self.events = EventLog(settings.event_log_size)
        self.signals = AgentSignals()
        self.times = RequestTimes()
        self.routed = RoutedPrefills()  # the coordinator reports each placement and each first token
        self.last_tick: float | None = None
        self.last_alerts_at: float | None = None
        self.shift_seen_at: float | None = None  # detection time of the latest shift the policy was shown
        self.last_decision: Decision | None = None
        self.moves = 0
        self.last_move_at: float | None = None  # wall clock, for /metrics

    def tick(self, now: float, force: bool = False) -> None:
        if not force and self.last_tick is not None and now - self.last_tick < self.settings.interval_s:
            return
        shift = self._new_shift()
        self.last_tick = now
        snapshot = self.snapshot(now, shift)
        decision = self.policy.decide(snapshot)
        self.last_decision = decision
        self.events.decision(now, decision)
        for move in decision.moves:
            self.set_role(move.worker_id, move.role)
            self.events.move(now, move.worker_id, move.role)
            self.moves += 1
            self.last_move_at = time.time()
        if self.last_alerts_at is None or now - self.last_alerts_at >= self.settings.interval_s:
            self.last_alerts_at = now  # alerts watch slow trends (KV hit ratio, retransmits): not on every push
            self._alerts(now)

    def _new_shift(self) -> Shift | None:
        """The latest shift's direction, the first time the policy sees it (shown once, not every tick)."""
        at, shift = self.signals.shift_at, self.signals.shift
        if at is None or at == self.shift_seen_at or shift not in ("think", "act"):
            return None
        self.shift_seen_at = at
        return "think" if shift == "think" else "act"

    def snapshot(self, now: float, shift: Shift | None = None) -> LoadSnapshot:
        alive = [w for w in self.workers if w.alive]
        loads = tuple(WorkerLoad(w.worker_id, w.role, w.stats.running, w.stats.prefill_tokens_waiting,
                                 w.stats.decode_streams, w.switched_at or None,
                                 kv_usage=w.stats.kv_usage) for w in alive)
        tpot = _mean(role_figures(DECODE, [(w.role, w.stats.decode_step_s) for w in alive]))
        rate = _mean(role_figures(PREFILL, [(w.role, w.stats.prefill_tokens_per_s) for w in alive]))
        line = mean_line(role_figures(DECODE, [(w.role, w.stats.decode_line) for w in alive]))
        return LoadSnapshot(now, loads, tpot, rate, self.signals.think_share, shift,
                            self.signals.forecast_prefill_tokens, self.signals.forecast_decode_tokens,
                            self.signals.admitted, line, self.routed.work(), self.max_streams_per_worker)

    def _alerts(self, now: float) -> None:
        alive = [w for w in self.workers if w.alive]
        inputs = AlertInputs(self.times.decode_s or None, self.times.prefill_s or None,
                             sum(w.stats.prefix_cache_queries for w in alive),
                             sum(w.stats.prefix_cache_hits for w in alive))
        for transition in self.alerts.evaluate(inputs, now):
            self.events.alert(transition)
            (log.warning if transition.firing else log.info)("capacity alert %s: %s", transition.alert,
                                                             transition.message)

    def update_signals(self, signals: AgentSignals, now: float) -> None:
        """Decide at once (not at the next interval) on a new shift event or a change in the admitted work."""
        shifted = signals.shift_at is not None and signals.shift_at != self.signals.shift_at
        admitted = signals.admitted != self.signals.admitted
        self.signals = signals
        if shifted and signals.shift is not None and signals.shift_at is not None:
            self.events.shift(signals.shift_at, signals.shift, signals.think_share)
        if shifted or admitted:
            self.tick(now, force=True)

    def role_applied(self, now: float, worker_id: int, role: str, latency_s: float) -> None:
        self.events.role_applied(now, worker_id, role, latency_s)

    def pin(self, prefill: int, decode: int, now: float) -> None:
        self.policy.pin(prefill, decode)
        self.tick(now, force=True)

    def unpin(self, now: float) -> None:
        self.policy.unpin()
        self.tick(now, force=True)

    def target(self) -> dict[str, int]:
        decision = self.last_decision
        return {} if decision is None else {PREFILL: decision.prefill, DECODE: decision.decode}

    def report(self) -> dict[str, JsonValue]:
        alive = [w for w in self.workers if w.alive]
        pinned = self.policy.pinned
        decision = self.last_decision
        return {
            "enabled": self.settings.enabled,
            "interval_s": self.settings.interval_s,
            "split": {role: sum(w.role == role for w in alive) for role in (PREFILL, DECODE)},
            "workers": [{"worker_id": w.worker_id, "pid": w.process.pid, "role": w.role, "running": w.stats.running,
                         "decode_streams": w.stats.decode_streams,
                         "waiting_prefill_tokens": w.stats.prefill_tokens_waiting,
                         "prefill_tokens_per_s": round(w.stats.prefill_tokens_per_s, 1),
                         "prefill_stall_tokens_per_s": round(w.stats.prefill_stall_tokens_per_s, 1)} for w in alive],
            "pinned": None if pinned is None else {"prefill": pinned[0], "decode": pinned[1]},
            "last_decision": None if decision is None else decision.reason,
            "alerts": list(self.alerts.active),
            "moves": self.moves,
            "admitted": None if self.signals.admitted is None else asdict(self.signals.admitted),
            "admitted_total": asdict(self.signals.admitted_total),
            **self.events.to_json(),
        }


def _mean(values: list[float]) -> float | None:
    measured = [v for v in values if v > 0]
    return sum(measured) / len(measured) if measured else None
