"""Where each agent session's KV lives in a disaggregated deployment: the worker that ran its last turn. That
worker pins the turn's tokens for the session's time-to-live and, after the pin runs out, still holds them in
its prefix cache until memory pressure evicts them, so a home outlives its pin; the coordinator sends the next
turn to the worker holding most of it (KV-aware routing). The oldest homes are forgotten past `max_homes`.

A home's tokens are an `array` of C ints: 4 bytes a token, against 35 for a list of Python ints (`tiny`'s ids of
the README, measured with tracemalloc), for up to `max_homes` sessions' histories. The cyclic collector walks a
list element by element, an array not; at the agent benchmark's knee (swe, 18.1 sessions/s) the homes were
212,000 of the 742,000 list elements a full collection of the gateway walked."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class SessionHome:
    worker_id: int
    token_ids: array[int]  # the last turn's prompt and output, C ints
    pinned_until: float  # monotonic seconds; later the KV is only likely still cached


class SessionHomes:
    def __init__(self, block_size: int, max_homes: int = 100_000) -> None:
        self.block_size, self.max_homes = block_size, max_homes
        self.homes: OrderedDict[str, SessionHome] = OrderedDict()  # least recently used first

    def turn_finished(self, key: str, worker_id: int, token_ids: Sequence[int], ttl_s: float, now: float) -> None:
        self.homes[key] = SessionHome(worker_id, array("i", token_ids), now + ttl_s)
        self.homes.move_to_end(key)
        while len(self.homes) > self.max_homes:
            self.homes.popitem(last=False)

    def set_ttl(self, key: str, ttl_s: float, now: float) -> int | None:
        """Re-time a session's pin; the worker that should hold it, or None when the session has no home."""
        home = self.homes.get(key)
        if home is None:
            return None
        home.pinned_until = now + ttl_s
        return home.worker_id

    def cached_tokens(self, key: str | None, prompt: Sequence[int]) -> dict[int, int]:
        """Per worker: leading prompt tokens it likely holds for this session, in whole blocks."""
        home = self.homes.get(key) if key is not None else None
        if home is None:
            return {}
        common = _common_prefix(home.token_ids, prompt)
        return {home.worker_id: common - common % self.block_size}

    def forget_worker(self, worker_id: int) -> None:
        for key in [k for k, h in self.homes.items() if h.worker_id == worker_id]:
            del self.homes[key]

    def __len__(self) -> int:
        return len(self.homes)


COMPARED_AT_ONCE = 64  # tokens a slice comparison checks before the scan goes token by token


def _common_prefix(held: array[int], prompt: Sequence[int]) -> int:
    """How many leading tokens `held` and `prompt` share, compared a slice at a time (in C, not token by token)."""
    n = min(len(held), len(prompt))
    asked = array("i", prompt[:n])
    if held[:n] == asked:  # the usual turn: the prompt goes on from the last one
        return n
    start = 0
    while held[start:start + COMPARED_AT_ONCE] == asked[start:start + COMPARED_AT_ONCE]:
        start += COMPARED_AT_ONCE
    return next(i for i in range(start, n) if held[i] != asked[i])
