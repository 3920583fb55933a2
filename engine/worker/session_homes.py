"""Where each agent session's KV lives in a disaggregated deployment: the decode worker that ran its last
turn keeps that turn's tokens pinned until the pin's time-to-live runs out. The coordinator reads this to
send the next turn to the worker that holds most of it (KV-aware routing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class SessionHome:
    worker_id: int
    token_ids: list[int]  # the last turn's prompt and output: what the pin holds
    expires_at: float  # monotonic seconds


class SessionHomes:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.homes: dict[str, SessionHome] = {}

    def turn_finished(self, key: str, worker_id: int, token_ids: list[int], ttl_s: float, now: float) -> None:
        self.homes[key] = SessionHome(worker_id, token_ids, now + ttl_s)

    def set_ttl(self, key: str, ttl_s: float, now: float) -> int | None:
        """Re-time a session's pin; the worker holding it, or None when no live pin is known."""
        home = self._live(key, now)
        if home is None:
            return None
        home.expires_at = now + ttl_s
        return home.worker_id

    def cached_tokens(self, key: str | None, prompt: Sequence[int], now: float) -> dict[int, int]:
        """Per worker: leading prompt tokens whose KV it holds for this session, in whole blocks."""
        home = self._live(key, now)
        if home is None:
            return {}
        common = _common_prefix(home.token_ids, prompt)
        return {home.worker_id: common - common % self.block_size}

    def forget_worker(self, worker_id: int) -> None:
        self.homes = {k: h for k, h in self.homes.items() if h.worker_id != worker_id}

    def _live(self, key: str | None, now: float) -> SessionHome | None:
        if key is None:
            return None
        home = self.homes.get(key)
        if home is not None and home.expires_at <= now:
            del self.homes[key]
            return None
        return home

    def __len__(self) -> int:
        return len(self.homes)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
