"""The capacity controller over vLLM `kv_both` instances: the embedded engine's `CapacityLoop` (the same
`CapacityPolicy`, event log, alerts, pinning and `/admin/capacity` report), whose workers are the pool's healthy
`kv_both` instances and whose move is a change of the instance's role in the pool: new requests of its old role
stop going to it, the ones it runs finish there. `kv_producer` and `kv_consumer` instances keep their roles and
are not the policy's workers. The split starts from `prefill_share`.

Like the embedded engine's, it runs on the engine thread: `LoadSignals` hands it the gateway's admitted work
(its demand) and the phase mix through `TokenizerFront.update_signals`, `/admin/capacity` reads and pins it
there, and `start` ticks it there every `interval_s`. The per-instance loads (`Replica.in_flight`,
`prefill_tokens`, `decode_streams`) are the gateway's own counts of what it routed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from engine import ROLES, CapacityLoop, CapacitySettings, EngineStats, JsonValue, LoadSnapshot, Shift, WorkerLoad
from gateway.upstream.pool import Replica, UpstreamPool

OnEngineThread = Callable[[Callable[[object], object]], None]  # AsyncLLMEngine.call


class UpstreamCapacity(CapacityLoop):
    def __init__(self, settings: CapacitySettings, pool: UpstreamPool) -> None:
        super().__init__(settings, [], self._move)
        self.pool = pool
        self.names = pool.movable  # worker id -> instance URL
        self.switched_at: dict[int, float] = {}  # worker id -> controller time of its latest move
        self._task: asyncio.Task[None] | None = None

    def _live(self) -> list[tuple[int, Replica]]:
        return [(i, self.pool.replicas[name]) for i, name in enumerate(self.names) if self.pool.replicas[name].healthy]

    def role(self, worker_id: int) -> str:
        return self.pool.roles[self.names[worker_id]]

    def snapshot(self, now: float, shift: Shift | None = None) -> LoadSnapshot:
        loads = tuple(WorkerLoad(i, self.role(i), r.in_flight, r.prefill_tokens, r.decode_streams,
                                 self.switched_at.get(i)) for i, r in self._live())
        signals = self.signals  # no measured step times upstream: the policy assumes the settings' rates
        return LoadSnapshot(now, loads, None, None, signals.think_share, shift, signals.forecast_prefill_tokens,
                            signals.forecast_decode_tokens, signals.admitted)

    def _move(self, worker_id: int, role: str) -> None:
        """A move takes effect at the next request routed: the time is the tick's."""
        self.pool.set_role(self.names[worker_id], role)
        self.switched_at[worker_id] = self.last_tick if self.last_tick is not None else time.monotonic()

    def split(self) -> dict[str, int]:
        live = [self.role(i) for i, _ in self._live()]
        return {role: live.count(role) for role in ROLES}

    def report(self) -> dict[str, JsonValue]:
        """The embedded controller's report; `split` and `workers` are the kv_both instances, `fixed` the
        kv_producer and kv_consumer ones."""
        workers: list[dict[str, JsonValue]] = [
            {"worker_id": i, "url": r.name, "role": self.role(i), "healthy": r.healthy, "running": r.in_flight,
             "decode_streams": r.decode_streams, "waiting_prefill_tokens": r.prefill_tokens}
            for i, r in ((i, self.pool.replicas[name]) for i, name in enumerate(self.names))]
        fixed: list[dict[str, JsonValue]] = [
            {"url": r.name, "kv_role": r.spec.kv_role, "role": self.pool.roles[r.name], "healthy": r.healthy}
            for r in self.pool.replicas.values() if r.spec.kv_role in ("kv_producer", "kv_consumer")]
        return {**super().report(), "split": dict(self.split()), "workers": workers, "fixed": fixed}

    def stats(self) -> EngineStats:
        """What `/metrics` shows of the controller, as the embedded engine's stats carry it."""
        return EngineStats(workers=self.split(), alerts=self.alerts.gauges(), role_moves=self.moves,
                           capacity_target=self.target(), last_move_at=self.last_move_at)

    def start(self, on_engine_thread: OnEngineThread) -> None:
        """Tick every `interval_s` (the hold and the smoothing need time to pass, not only new signals)."""
        async def steer() -> None:
            while True:
                await asyncio.sleep(self.settings.interval_s)
                on_engine_thread(lambda _: self.tick(time.monotonic()))

        self._task = asyncio.get_running_loop().create_task(steer())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
