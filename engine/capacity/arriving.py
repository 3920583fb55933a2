"""The mix of the work arriving at the gateway: of the worker-seconds that the turns admitted within the last
`mix_window_s` bring, the prefill share. It is taken at the settings' per-worker rates, not measured ones: on a
shared host a worker's measured rates depend on the split (a decode worker sharing cores with busy prefill workers
steps slower), so a mix from measured rates, like a mix of the backlog, would move with the controller's own
moves. The arriving work's does not."""

from __future__ import annotations

from collections import deque

from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import AdmittedWork


class ArrivingMix:
    def __init__(self, settings: CapacitySettings) -> None:
        self.settings = settings
        self._totals: deque[tuple[float, AdmittedWork]] = deque()  # (when, all work admitted by then)

    def observe(self, now: float, total: AdmittedWork) -> None:
        """The gateway's running total at `now`; the oldest kept is the last at or before the window's start."""
        self._totals.append((now, total))
        while len(self._totals) > 1 and self._totals[1][0] <= now - self.settings.mix_window_s:
            self._totals.popleft()

    def prefill_share(self) -> float | None:
        """Prefill's share (0..1) of the arriving work's worker-seconds; None before any work arrived."""
        if len(self._totals) < 2:
            return None
        arrived = self._totals[-1][1] - self._totals[0][1]
        prefill_s = arrived.prefill_tokens / self.settings.prefill_tokens_per_s
        decode_s = arrived.decode_tokens * self.settings.decode_s_per_token
        return prefill_s / (prefill_s + decode_s) if prefill_s + decode_s > 0 else None
