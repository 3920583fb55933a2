"""Seeded, reproducible multi-turn agent workloads: Mooncake trace replay, WebArena- and SWE-agent-shaped
sessions. Each module's `build(...)` returns a `Workload` (types.py) for a runner to play through the gateway."""

from agents_eval.workloads.types import ACT, APPEND, LAST_ACTION, THINK, SessionScript, Turn, Workload

__all__ = ["ACT", "APPEND", "LAST_ACTION", "THINK", "SessionScript", "Turn", "Workload"]
