"""The capacity loop decides on every push of admitted work, and evaluates its alerts once an interval."""

from __future__ import annotations

import pytest

from engine.capacity.loop import CapacityLoop
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import AdmittedWork
from engine.core.stats import AgentSignals
from engine.workers import messages as m
from engine.workers.coordinator.handles import WorkerHandle


def test_pushed_decisions_evaluate_the_alerts_once_an_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    workers = [WorkerHandle(i, m.PREFILL if i == 0 else m.DECODE, None, None)  # type: ignore[arg-type]
               for i in range(2)]  # no process: the loop only reads them
    loop = CapacityLoop(CapacitySettings(interval_s=0.1), workers, lambda worker_id, role: None)
    evaluated: list[float] = []
    monkeypatch.setattr(loop, "_alerts", evaluated.append)
    decided: list[float] = []
    for now in (0.0, 0.01, 0.02, 0.05, 0.12, 0.15):
        loop.update_signals(AgentSignals(admitted=AdmittedWork(prefill_tokens=round(now * 1000) + 1, prompts=1)), now)
        decided.append(loop.last_tick or 0.0)
    assert decided == [0.0, 0.01, 0.02, 0.05, 0.12, 0.15]  # each change of the admitted work is decided at once
    assert evaluated == [0.0, 0.12]
    loop.tick(0.2)  # within an interval of the last decision: nothing
    loop.tick(0.26)
    assert loop.last_tick == 0.26 and evaluated == [0.0, 0.12, 0.26]
