"""The prefill/decode split: which workers change role now. Demand is measured in workers kept busy at the latency
targets. Its source is the gateway's admitted work when the snapshot carries it (`LoadSnapshot.admitted`): the
uncached prompt tokens of the prompts not yet past their first token, and the streams not yet finished with their
expected output tokens. It is known at admission and retired as turns are served, so it has no statistical delay.
Without it (an engine driven directly) the workers' queues stand in: the waiting prompt tokens and the active
streams, smoothed over `demand_smoothing_s` because a queue bursts. Prefill: the prompt tokens for the prefill
workers, to be computed within `prefill_drain_s` (a prompt keeps at most one worker busy: it is prefilled on one),
plus the forecast prompt tokens within `forecast_horizon_s`, at the measured seconds per token of one worker. Which
prompt tokens are the prefill workers' is the router's call (`LoadSnapshot.routed`): a placed prompt that a
prefill worker computes is theirs, and so is one a prefill worker would take where the deployment has none (it
failed conditional disaggregation's local gate, and the deployment is not idle); any other is prefilled where it
decodes, and its tokens, computed within the same drain time, add to the decode workers' demand. So a workload
whose every turn passes the gate (agent turns, a small delta on a cached history) asks for no prefill worker at
all; its forecast prompt tokens split as the router split the recent placements' tokens (`remote_share`).
Without the router's split, the prompt tokens queued on decode workers count for neither role. Decode: the
streams owed a token every `target_tpot_s` (an admitted stream no faster than its expected tokens spread over the
horizon; the forecast output tokens within the horizon count as streams at that pace), at the workers' fitted
decode line, t(b) = base + per_stream x b: spread over d workers they step within the target from d = per_stream x
streams / (target - base) on (at most one worker a stream). The line makes the demand the same whatever the split;
a flat seconds-per-token read of the step time at the current batch would say more workers the more decode has, and
invite moves it cannot fill. Until the line is fitted, one through 0 at the measured step time over the streams per
decoding worker stands in. However cheap the steps, the decode demand is at least the requests over the engine's
`max_num_seqs` (`LoadSnapshot.max_streams_per_worker`): a worker runs no more at once, the rest wait for a slot.

Hysteresis by demand margin: a worker moves to a role only while that role has more demand than workers (it
misses its target) and, before the worker joins, more demand per worker than the giving role will have after
it leaves, by over `demand_margin`. So a split under which every role meets its target stays, an imbalance
within the margin stays, and a move never invites its reversal at the same demand. Time adds to this only for
reversals: a role that gained a worker within `hold_s` gives none back unless the demand clearly asks for it
(per worker, the taking role's demand is over 1 + `demand_margin` and the giving role's, in the workers it
keeps, under 1 - `demand_margin`). Where `min_per_role` is 0, a split may leave a role no worker: its work
then falls on the other role's workers (no prefill worker: every turn is prefilled where it decodes), so for a
move that empties a role, the giving role's demand after it is both roles' demand over the taking role's workers.
A role with no worker takes one back when it has work of its own (over `demand_margin`) and the giving role meets
its target without that worker (under 1 - `demand_margin` per worker): the split disaggregates again once it can
afford to, and never while both roles are overloaded, where a move would only trade one role's misses for the
other's. The two rules cannot undo each other: emptying a role needs the other over its target. A
phase shift event (the think/act classifier's second signal) moves one step ahead of the queue: to think, at
least one more prefill worker (and at least round(workers x think_share) when the share is known); to act, at
least one fewer. Each role keeps `min_per_role` workers; with no work and nothing forecast the split stays. A
pinned split (`pin`) overrides all of this: no floor, no hold. The worker that moves is the least loaded of the
giving role (ties: lowest id), so decisions are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from engine.capacity.demand import Demand, decode_workers, demand
from engine.capacity.settings import CapacitySettings, check_split
from engine.capacity.signals import DECODE, PREFILL, LoadSnapshot, WorkerLoad

__all__ = ["CapacityPolicy", "Decision", "Demand", "Move", "decode_workers", "demand"]


class Move(NamedTuple):
    worker_id: int
    role: str  # the new role


@dataclass(frozen=True)
class Decision:
    prefill: int  # the target split
    decode: int
    moves: tuple[Move, ...]  # the role changes to apply now (held workers may leave the target unmet)
    reason: str
    demand: Demand


def _margin_steps(need: Demand, prefill: int, decode: int, settings: CapacitySettings) -> int:
    """Workers to move to prefill (negative: to decode). One more moves only while the role taking it, before it
    joins, has more demand than workers (it misses its latency target) and more demand per worker than the giving
    role will have after it leaves, by over `demand_margin`. Decode never gives a worker its held KV needs: memory
    is not a rate that a busier worker catches up on, a history that does not fit is recomputed."""
    floor, margin = settings.min_per_role, settings.demand_margin
    memory_floor = max(floor, math.ceil(round(need.decode_memory, 6)))  # the decode workers its held KV fills
    to_prefill = _steps(need.prefill, prefill, need.decode, decode, memory_floor, margin)
    return to_prefill or -_steps(need.decode, decode, need.prefill, prefill, floor, margin)


def _steps(taking_need: float, taking: int, giving_need: float, giving: int, floor: int, margin: float) -> int:
    steps = 0
    while giving - steps - 1 >= floor and _worth_one_more(taking_need, taking + steps, giving_need,
                                                          giving - steps - 1, margin):
        steps += 1
    return steps


def _worth_one_more(taking_need: float, taking: int, giving_need: float, giving_after: int, margin: float) -> bool:
    if taking == 0:  # its work runs beside the giving role's on the giving role's workers (min_per_role 0)
        return giving_after > 0 and taking_need > margin and giving_need / giving_after < 1.0 - margin
    busy = taking_need / taking
    if giving_after == 0:  # the giving role is left no worker: its work falls on the taking role's
        return busy > 1.0 and busy - (taking_need + giving_need) / (taking + 1) > margin
    return busy > 1.0 and busy - giving_need / giving_after > margin


def _per_worker(need: float, workers: int) -> float:
    if workers > 0:
        return need / workers
    return math.inf if need > 0 else 0.0


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
        need = demand(snapshot, self.settings)
        if snapshot.admitted is None:
            need = self._smooth(need, snapshot.now)
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
                          old.decode + weight * (need.decode - old.decode), need.decode_memory)
        self._smoothed = (now, smoothed)
        return smoothed

    def _target(self, snapshot: LoadSnapshot, need: Demand, current: int) -> tuple[int, str]:
        if need.prefill + need.decode > 0:
            target = current + _margin_steps(need, current, len(snapshot.workers) - current, self.settings)
            source = "queues" if snapshot.admitted is None else "admitted"
            why = f"load ({source}): prefill {need.prefill:.2f} workers, decode {need.decode:.2f}"
            if snapshot.decode_line is not None:
                base, per_stream = snapshot.decode_line
                why += f" (decode step {1000 * base:.1f} ms + {1000 * per_stream:.2f} ms a stream)"
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
        held = (hold and wanted > 0 and self._gained_recently(snapshot, giving)
                and not _clearly_asked(snapshot, need, taking, wanted, self.settings.demand_margin))
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


def _clearly_asked(snapshot: LoadSnapshot, need: Demand, taking: str, wanted: int, margin: float) -> bool:
    """The demand asks for the move beyond doubt: the taking role's demand per worker is over 1 + margin (it
    misses its target by the margin), and the giving role's, in the workers it keeps, is under 1 - margin."""
    giving = DECODE if taking == PREFILL else PREFILL
    by_role = {PREFILL: need.prefill, DECODE: need.decode}
    return (_per_worker(by_role[taking], snapshot.count(taking)) > 1 + margin
            and _per_worker(by_role[giving], snapshot.count(giving) - wanted) < 1 - margin)
