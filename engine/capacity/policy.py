"""The prefill/decode split: which workers change role this interval.

Demand is measured in workers kept busy. Prefill: the waiting prompt tokens, to be computed within
`prefill_drain_s`, plus the forecast prompt tokens, within `forecast_horizon_s`, at the measured seconds per
token of one worker. Decode: the active streams, each owed a token every `target_tpot_s`, plus the forecast
output tokens within the horizon, at the measured worker seconds per output token (the decode step time over
the streams per decoding worker). The workers are split in proportion.

Hysteresis: nothing moves while the ideal prefill count is within 0.5 + `deadband_workers` of the current
one, and a role that gained a worker within `hold_s` gives none back until then: the worker that moved does
not switch back, nor does the split reverse through another worker (the move waits). A
phase shift event moves one step ahead of the queue: to think, at least one more prefill worker (and at least
round(workers x think_share) when the share is known); to act, at least one fewer. Each role keeps
`min_per_role` workers, so when only one role has work it takes all but that floor; with no work at all and
nothing forecast the split stays as it is. A pinned split (`pin`) overrides all of this: no floor, no hold.
The worker that moves is the least loaded of the giving role (ties: lowest id), so decisions are
deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from engine.capacity.settings import CapacitySettings, check_split
from engine.capacity.signals import DECODE, PREFILL, LoadSnapshot, WorkerLoad


class Move(NamedTuple):
    worker_id: int
    role: str  # the new role


@dataclass(frozen=True)
class Demand:
    prefill: float  # workers the prefill load keeps busy
    decode: float


@dataclass(frozen=True)
class Decision:
    prefill: int  # the target split
    decode: int
    moves: tuple[Move, ...]  # the role changes to apply now (held workers may leave the target unmet)
    reason: str
    demand: Demand


def decode_s_per_token(snapshot: LoadSnapshot, settings: CapacitySettings) -> float:
    """Worker seconds per output token of one stream: the step time over the streams per decoding worker."""
    streams = [w.decode_streams for w in snapshot.workers if w.decode_streams]
    if not snapshot.tpot_s or not streams:
        return settings.decode_s_per_token
    return snapshot.tpot_s * len(streams) / sum(streams)


def demand(snapshot: LoadSnapshot, settings: CapacitySettings) -> Demand:
    horizon = settings.forecast_horizon_s
    prefill_s_per_token = 1.0 / (snapshot.prefill_tokens_per_s or settings.prefill_tokens_per_s)
    prefill_tokens_per_s = (snapshot.prefill_tokens_waiting / settings.prefill_drain_s
                            + snapshot.forecast_prefill_tokens / horizon)
    decode_tokens_per_s = (snapshot.decode_streams / settings.target_tpot_s
                           + snapshot.forecast_decode_tokens / horizon)
    return Demand(prefill_s_per_token * prefill_tokens_per_s,
                  decode_s_per_token(snapshot, settings) * decode_tokens_per_s)


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _load_order(worker: WorkerLoad) -> tuple[int, int, int, int]:
    return worker.running, worker.waiting_prefill_tokens, worker.decode_streams, worker.worker_id


class CapacityPolicy:
    def __init__(self, settings: CapacitySettings) -> None:
        self.settings = settings
        self._pinned = settings.pinned_split
        self._smoothed: tuple[float, Demand] | None = None  # (at, demand averaged over demand_smoothing_s)

    @property
    def pinned(self) -> tuple[int, int] | None:
        return self._pinned

    def pin(self, prefill: int, decode: int) -> None:
        """Hold this split (scaled to the live workers when their number differs) until `unpin`."""
        check_split(prefill, decode)
        self._pinned = (prefill, decode)

    def unpin(self) -> None:
        self._pinned = None

    def decide(self, snapshot: LoadSnapshot) -> Decision:
        need = self._smooth(demand(snapshot, self.settings), snapshot.now)
        if self._pinned is not None:
            return self._pinned_decision(snapshot, self._pinned, need)
        current = snapshot.count(PREFILL)
        if not self.settings.enabled:
            return self._decision(snapshot, current, need, "controller disabled")
        low, high = self.settings.min_per_role, len(snapshot.workers) - self.settings.min_per_role
        if low > high:
            return self._decision(snapshot, current, need, "fewer workers than two roles' min_per_role")
        target, why = self._target(snapshot, need, current)
        return self._decision(snapshot, min(max(target, low), high), need, why)

    def _smooth(self, need: Demand, now: float) -> Demand:
        """An exponential average with time constant demand_smoothing_s: a burst of queued prompts is not a
        shift of the load (phase-shift events still move ahead of it)."""
        tau = self.settings.demand_smoothing_s
        if self._smoothed is None or tau == 0:
            self._smoothed = (now, need)
            return need
        at, old = self._smoothed
        weight = 1.0 - math.exp(-max(0.0, now - at) / tau)
        smoothed = Demand(old.prefill + weight * (need.prefill - old.prefill),
                          old.decode + weight * (need.decode - old.decode))
        self._smoothed = (now, smoothed)
        return smoothed

    def _target(self, snapshot: LoadSnapshot, need: Demand, current: int) -> tuple[int, str]:
        total = need.prefill + need.decode
        if total > 0:
            ideal = len(snapshot.workers) * need.prefill / total
            near = abs(ideal - current) < 0.5 + self.settings.deadband_workers
            target = current if near else _round_half_up(ideal)
            why = f"load: prefill {need.prefill:.2f} workers, decode {need.decode:.2f}"
        else:
            target, why = current, "no load"
        if snapshot.shift is not None:
            target = self._ahead_of_queue(snapshot, target, current)
            why += f"; shift to {snapshot.shift}"
        return target, why

    def _ahead_of_queue(self, snapshot: LoadSnapshot, target: int, current: int) -> int:
        share = snapshot.think_share
        if snapshot.shift == "think":
            hint = current + 1 if share is None else _round_half_up(len(snapshot.workers) * share)
            return max(target, current + 1, hint)
        hint = current - 1 if share is None else _round_half_up(len(snapshot.workers) * share)
        return min(target, current - 1, hint)

    def _pinned_decision(self, snapshot: LoadSnapshot, pinned: tuple[int, int], need: Demand) -> Decision:
        prefill, decode = pinned
        workers = len(snapshot.workers)
        target = (2 * workers * prefill + prefill + decode) // (2 * (prefill + decode))  # rounded half up
        return self._decision(snapshot, target, need, f"pinned {prefill} prefill / {decode} decode", hold=False)

    def _decision(self, snapshot: LoadSnapshot, target: int, need: Demand, why: str, hold: bool = True
                  ) -> Decision:
        current = snapshot.count(PREFILL)
        giving, taking = (DECODE, PREFILL) if target > current else (PREFILL, DECODE)
        wanted = abs(target - current)
        held = hold and wanted > 0 and self._gained_recently(snapshot, giving)
        candidates = sorted((w for w in snapshot.workers if w.role == giving), key=_load_order)
        moves = () if held else tuple(Move(w.worker_id, taking) for w in candidates[:wanted])
        workers = len(snapshot.workers)
        reason = f"{why} -> {target} prefill / {workers - target} decode"
        if held:
            reason += f"; held: {giving} gained a worker within hold_s"
        return Decision(target, workers - target, moves, reason, need)

    def _gained_recently(self, snapshot: LoadSnapshot, role: str) -> bool:
        return any(w.role == role and w.last_switch_at is not None
                   and snapshot.now - w.last_switch_at < self.settings.hold_s for w in snapshot.workers)
