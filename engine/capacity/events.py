"""The controller's recent history for `GET /admin/capacity`: a bounded, timestamped event log.

Kinds: `decision` (recorded when it moves workers or its target split changes, so a controller deciding
every 100 ms does not flood the log), `move` (a role change sent), `role_applied` (a worker confirmed it),
`alert` (fired or cleared), `shift` (a phase shift event). The oldest events fall out first."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from engine.capacity.alerts import AlertTransition
from engine.capacity.policy import Decision

JsonValue = str | int | float | bool | None | list[Any] | dict[str, Any]


@dataclass(frozen=True)
class CapacityEvent:
    at: float
    kind: str
    detail: dict[str, JsonValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, JsonValue]:
        return {"at": self.at, "kind": self.kind, **self.detail}


class EventLog:
    def __init__(self, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"event log capacity must be at least 1, got {capacity}")
        self._events: deque[CapacityEvent] = deque(maxlen=capacity)
        self.recorded = 0
        self._last_split: tuple[int, int] | None = None

    @property
    def events(self) -> list[CapacityEvent]:
        return list(self._events)

    def record(self, at: float, kind: str, **detail: JsonValue) -> CapacityEvent:
        event = CapacityEvent(at, kind, detail)
        self._events.append(event)
        self.recorded += 1
        return event

    def decision(self, at: float, decision: Decision) -> CapacityEvent | None:
        split = (decision.prefill, decision.decode)
        if not decision.moves and split == self._last_split:
            return None
        self._last_split = split
        return self.record(at, "decision", prefill=decision.prefill, decode=decision.decode,
                           moves=[[move.worker_id, move.role] for move in decision.moves], reason=decision.reason,
                           prefill_need=decision.demand.prefill, decode_need=decision.demand.decode)

    def move(self, at: float, worker_id: int, role: str) -> CapacityEvent:
        return self.record(at, "move", worker_id=worker_id, role=role)

    def role_applied(self, at: float, worker_id: int, role: str, latency_s: float) -> CapacityEvent:
        return self.record(at, "role_applied", worker_id=worker_id, role=role, latency_s=latency_s)

    def alert(self, transition: AlertTransition) -> CapacityEvent:
        return self.record(transition.at, "alert", alert=transition.alert, firing=transition.firing,
                           value=transition.value, threshold=transition.threshold, message=transition.message)

    def shift(self, at: float, direction: str, think_share: float | None) -> CapacityEvent:
        return self.record(at, "shift", direction=direction, think_share=think_share)

    def to_json(self) -> dict[str, JsonValue]:
        return {"capacity": self._events.maxlen, "recorded": self.recorded,
                "dropped": self.recorded - len(self._events), "events": [e.to_json() for e in self._events]}
