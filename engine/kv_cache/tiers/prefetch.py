"""Prefetch over tool gaps: a session whose turn ended in a tool call has its KV promoted back to the device
`lead_s` before the tool result is due, so the next turn finds it there even if it was demoted during the
gap. Pure policy with an injected clock: the engine asks `pop_due(now)` every step."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class PrefetchStats:
    scheduled: int = 0
    started: int = 0  # promotions begun (blocks already on the device cost nothing)


@dataclass
class PrefetchSchedule:
    lead_s: float
    max_sessions: int = 4096  # chains remembered (least recently finished forgotten first)
    chains: OrderedDict[str, tuple[int, ...]] = field(default_factory=OrderedDict)
    due: dict[str, float] = field(default_factory=dict)
    stats: PrefetchStats = field(default_factory=PrefetchStats)

    def remember(self, key: str, block_hashes: tuple[int, ...]) -> None:
        """The chained hashes of the session's last turn, head first."""
        self.chains[key] = block_hashes
        self.chains.move_to_end(key)
        while len(self.chains) > self.max_sessions:
            forgotten, _ = self.chains.popitem(last=False)
            self.due.pop(forgotten, None)

    def schedule(self, key: str, result_due_at: float) -> bool:
        """Promote the session's KV at result_due_at - lead_s; False when no turn of it is remembered."""
        if key not in self.chains:
            return False
        self.due[key] = result_due_at - self.lead_s
        self.stats.scheduled += 1
        return True

    def pop_due(self, now: float) -> list[tuple[int, ...]]:
        """Chains whose promotion time has come, earliest first; each is handed out once."""
        ready = sorted((at, key) for key, at in self.due.items() if at <= now)
        for _, key in ready:
            del self.due[key]
        self.stats.started += len(ready)
        return [self.chains[key] for _, key in ready]
