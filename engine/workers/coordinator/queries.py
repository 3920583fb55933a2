"""What the coordinator asks of its workers beside serving: their stats and reports summed over the live ones, and
the commands it sends every worker or one (session TTLs, role changes, KV counters, prefix-cache resets, fault
injection). A collaborator of `WorkerEngine`, which answers the gateway's metrics, admin routes and the capacity
controller through it: it owns the answers it waits for and is given what it needs (the worker handles, the
sessions' homes, how to send a command and how to step the coordinator while it waits)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engine.capacity.loop import CapacityLoop
from engine.core.stats import AgentSignals, EngineStats, WorkerReport
from engine.kv_cache.tiers.engine import total_tier_stats
from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle
from engine.workers.coordinator.session_homes import SessionHomes

Send = Callable[[WorkerHandle, m.Command], bool]  # False: the worker's pipe is broken (it died)


class WorkerQueries:
    def __init__(self, workers: list[WorkerHandle], homes: SessionHomes, send: Send, step: Callable[[], Any],
                 colocated: bool) -> None:
        self.workers = workers
        self.homes = homes
        self.colocated = colocated  # one worker doing it all, never moved
        self.capacity: CapacityLoop | None = None  # the coordinator's controller, once it has one
        self._send = send
        self._step = step  # handles the workers' events, answers included
        self._counters: dict[int, m.KVCounters] = {}
        self._resets: dict[int, bool] = {}

    def answered(self, event: m.Event) -> bool:
        """Take a worker's answer to one of these questions; False for any other event."""
        if isinstance(event, m.Counters):
            self._counters[event.worker_id] = event.counters
        elif isinstance(event, m.PrefixCacheReset):
            self._resets[event.worker_id] = event.done
        else:
            return False
        return True

    def set_session_ttl(self, key: str, ttl_s: float) -> bool:
        """Re-time the KV pin of a session's last turn on the worker holding it; False when none does."""
        worker_id = self.homes.set_ttl(key, ttl_s, time.monotonic())
        if worker_id is None or not self.workers[worker_id].alive:
            return False
        return self._send(self.workers[worker_id], m.SetSessionTTL(key, ttl_s))

    def update_signals(self, signals: AgentSignals) -> None:
        if self.capacity is not None:
            self.capacity.update_signals(signals, time.monotonic())

    def stats(self) -> EngineStats:
        alive = [w for w in self.workers if w.alive]
        roles = {role: sum(self._role_name(w.role) == role for w in alive)
                 for role in (("colocated",) if self.colocated else (m.PREFILL, m.DECODE))}
        total = EngineStats.total([w.stats for w in alive], roles)
        if self.capacity is None:
            return total
        return replace(total, alerts=self.capacity.alerts.gauges(), role_moves=self.capacity.moves,
                       capacity_target=self.capacity.target(), last_move_at=self.capacity.last_move_at)

    def worker_reports(self) -> list[WorkerReport]:
        return [WorkerReport(w.worker_id, self._role_name(w.role), w.node, w.stats) for w in self.workers if w.alive]

    def _role_name(self, role: str) -> str:
        """The colocated engine's one worker is neither a prefill nor a decode worker to the outside."""
        return "colocated" if self.colocated else role

    def kv_tier_stats(self) -> dict[str, Any] | None:
        """The workers' KV tier counters summed, as of their latest Load reports (a dead worker's last one
        included, so totals never go back); None before any worker with tiers has reported."""
        return total_tier_stats([w.kv_tiers for w in self.workers if w.kv_tiers is not None])

    def inject_kv_fault(self, fault: str | None) -> None:
        """Failure testing only: make every prefill worker damage its KV transfers (None: stop)."""
        for worker in self.workers:
            if worker.alive:
                self._send(worker, m.InjectKVFault(fault))

    def kv_counters(self, timeout_s: float = 10.0) -> dict[int, m.KVCounters]:
        """Each live worker's KV receive counters (asked between their steps)."""
        self._counters.clear()
        self._ask_every_worker(m.CountersQuery(), self._counters, timeout_s)
        return dict(self._counters)

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> bool:
        """Every live worker forgets its cached blocks; False if any could not (a request holds blocks)."""
        self._resets.clear()
        self._ask_every_worker(m.ResetPrefixCache(), self._resets, timeout_s)
        return len(self._resets) == sum(w.alive for w in self.workers) and all(self._resets.values())

    def _ask_every_worker(self, command: m.Command, answers: dict[int, Any], timeout_s: float) -> None:
        for worker in self.workers:
            if worker.alive:
                self._send(worker, command)
        deadline = time.monotonic() + timeout_s
        while len(answers) < sum(w.alive for w in self.workers) and time.monotonic() < deadline:
            self._step()

    def set_role(self, worker_id: int, role: str) -> None:
        worker = self.workers[worker_id]
        worker.role = role
        worker.switched_at = time.monotonic()
        self._send(worker, m.SetRole(role, time.time()))
