"""Which workers take a request: the coordinator's adapter between its worker handles and the routing
policy (`engine.capacity.routing`: KV-aware choice of the decode worker, conditional disaggregation)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.capacity.routing import Placement, Turn, place
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import WorkerLoad
from engine.core.sequence import SessionRef
from engine.workers.coordinator.handles import WorkerHandle
from engine.workers.coordinator.session_homes import SessionHomes


class Placer:
    def __init__(self, workers: list[WorkerHandle], homes: SessionHomes, settings: CapacitySettings,
                 block_size: int) -> None:
        self.workers, self.homes, self.settings, self.block_size = workers, homes, settings, block_size

    def place(self, session: SessionRef | None, prompt: Sequence[int], requests: dict[int, int]) -> Placement:
        """requests: worker id -> requests the coordinator has on it (fresher than the Load reports)."""
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise RuntimeError("every engine worker has died")
        loads = [WorkerLoad(w.worker_id, w.role, requests.get(w.worker_id, 0), w.stats.prefill_tokens_waiting,
                            w.stats.decode_streams, prefill_tokens_per_s=w.stats.prefill_tokens_per_s or None,
                            prefill_stall_tokens_per_s=w.stats.prefill_stall_tokens_per_s or None)
                 for w in alive]
        cached = self.homes.cached_tokens(session.key if session else None, prompt)
        return place(Turn(len(prompt), session.key if session else None, cached), loads, self.settings,
                     self.block_size)
