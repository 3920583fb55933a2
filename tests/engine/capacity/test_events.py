from __future__ import annotations

import json

import pytest

from engine.capacity.alerts import AlertTransition
from engine.capacity.events import EventLog
from engine.capacity.policy import Decision, Demand, Move


def decision(moves: tuple[Move, ...] = (), reason: str = "load", prefill: int = 2) -> Decision:
    return Decision(prefill, 3 - prefill, moves, reason, Demand(1.5, 0.5))


def test_the_log_keeps_the_newest_events() -> None:
    log = EventLog(capacity=3)
    for i in range(5):
        log.move(float(i), i, "prefill")
    assert [e.detail["worker_id"] for e in log.events] == [2, 3, 4]
    body = log.to_json()
    assert (body["capacity"], body["recorded"], body["dropped"]) == (3, 5, 2)


def test_every_kind_serialises_to_json() -> None:
    log = EventLog()
    log.decision(1.0, decision((Move(2, "prefill"),)))
    log.move(1.0, 2, "prefill")
    log.role_applied(1.01, 2, "prefill", latency_s=0.01)
    log.alert(AlertTransition("kv_hit_ratio", True, 0.5, 0.6, 2.0, "KV hit ratio 0.5 <= 0.6"))
    log.shift(3.0, "think", 0.8)
    body = json.loads(json.dumps(log.to_json()))
    assert [e["kind"] for e in body["events"]] == ["decision", "move", "role_applied", "alert", "shift"]
    assert body["events"][0]["moves"] == [[2, "prefill"]] and body["events"][0]["prefill_need"] == 1.5
    assert body["events"][3] == {"at": 2.0, "kind": "alert", "alert": "kv_hit_ratio", "firing": True, "value": 0.5,
                                 "threshold": 0.6, "message": "KV hit ratio 0.5 <= 0.6"}


def test_decisions_are_logged_when_they_move_or_change_the_target() -> None:
    log = EventLog()
    assert log.decision(0.0, decision()) is not None
    assert log.decision(0.1, decision(reason="load: prefill 1.52 workers")) is None  # same target, new numbers
    assert log.decision(0.2, decision(prefill=1)) is not None
    assert log.decision(0.3, decision((Move(0, "decode"),), prefill=1)) is not None
    assert len(log.events) == 3


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EventLog(capacity=0)
