"""Which workers take a request: the coordinator's adapter between its worker handles and the routing
policy in `engine.capacity.routing`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.sequence import SessionRef
from engine.worker import messages as m
from engine.worker.handles import WorkerHandle
from engine.worker.session_homes import SessionHomes

LOCAL_PREFILL_MAX_TOKENS = 0


@dataclass(frozen=True)
class Placement:
    decode: int
    prefill: int | None  # None: prefill where it decodes


class Placer:
    def __init__(self, workers: list[WorkerHandle], homes: SessionHomes, block_size: int) -> None:
        self.workers, self.homes, self.block_size = workers, homes, block_size

    def place(self, session: SessionRef | None, prompt: Sequence[int], loads: dict[int, int],
              now: float) -> Placement:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            raise RuntimeError("every engine worker has died")
        decoders = [w for w in alive if w.role == m.DECODE] or alive
        prefillers = [w for w in alive if w.role == m.PREFILL]
        cached = self.homes.cached_tokens(session.key if session else None, prompt, now)
        decode = min(decoders, key=lambda w: ((len(prompt) - cached.get(w.worker_id, 0)) // self.block_size
                                              + loads.get(w.worker_id, 0), w.worker_id))
        uncached = len(prompt) - cached.get(decode.worker_id, 0)
        if not prefillers or uncached <= LOCAL_PREFILL_MAX_TOKENS or decode.role != m.DECODE:
            return Placement(decode.worker_id, None)
        prefill = min(prefillers, key=lambda w: (loads.get(w.worker_id, 0), w.worker_id))
        return Placement(decode.worker_id, prefill.worker_id)
