"""Queue policies: the order in which the scheduler serves its waiting and running requests. Pure policy,
no torch.

- `FcfsPolicy` keeps both queues as they are: waiting in arrival order, running in admission order, so the
  most recently admitted request is the one preempted.
- `SloPolicy` orders the waiting (prefill) queue VIP first, then by deadline: arrival plus the TTFT target
  of the request's class. Within a class (same VIP-ness and TTFT target), session fairness decides which
  request gets which of the class's deadlines: least attained service first (Autellix), by arrival plus
  one more TTFT per level of service the request's agent session has already had. One long agent program
  so does not starve the others, yet waits at most max_level TTFTs for them, and other classes see the
  same deadlines as without it. The running queue puts decodes (one token each) before unfinished
  prefill chunks, so a long prompt never stalls the streams (Sarathi), then VIP first, then fewest
  remaining steps; the scheduler preempts from its tail, so the victim is the lowest-priority request.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Literal, Protocol

from engine.core.slo import Fairness, SloConfig

if TYPE_CHECKING:
    from engine.core.sequence import Sequence

PolicyName = Literal["fcfs", "slo"]


class QueuePolicy(Protocol):
    def order_waiting(self, waiting: deque[Sequence], now: float) -> None: ...
    def order_running(self, running: list[Sequence]) -> None: ...
    def served(self, seq: Sequence, num_tokens: int, now: float) -> None: ...


class FcfsPolicy:
    def order_waiting(self, waiting: deque[Sequence], now: float) -> None:
        """Arrival order, preempted requests at the front: as they were queued."""

    def order_running(self, running: list[Sequence]) -> None:
        """Admission order."""

    def served(self, seq: Sequence, num_tokens: int, now: float) -> None:
        """FCFS keeps no account of service."""


class SessionService:
    """Tokens each session was given, decayed with a half-life; at most max_sessions are remembered."""

    def __init__(self, fairness: Fairness) -> None:
        self.fairness = fairness
        self._service: dict[str, tuple[float, float]] = {}  # key -> (tokens, as of when)

    def tokens(self, key: str, now: float) -> float:
        tokens, since = self._service.get(key, (0.0, now))
        return tokens * 0.5 ** (max(0.0, now - since) / self.fairness.half_life_s)

    def add(self, key: str, num_tokens: int, now: float) -> None:
        self._service[key] = (self.tokens(key, now) + num_tokens, now)
        if len(self._service) > self.fairness.max_sessions:
            del self._service[min(self._service, key=lambda k: self.tokens(k, now))]

    def level(self, key: str, now: float) -> int:
        """0 below one quantum of service, then one more per doubling, capped at max_level."""
        quanta = self.tokens(key, now) / self.fairness.quantum_tokens
        return min(self.fairness.max_level, int(math.log2(1.0 + quanta)))


class SloPolicy:
    def __init__(self, config: SloConfig) -> None:
        self.config = config
        self.sessions = SessionService(config.fairness)

    def is_vip(self, seq: Sequence) -> bool:
        return self.config.slo_class(seq.params.slo_class).vip or (seq.session is not None and seq.session.vip)

    def deadline(self, seq: Sequence) -> float:
        return seq.arrival_time + self.config.slo_class(seq.params.slo_class).ttft_s

    def fair_deadline(self, seq: Sequence, now: float) -> float:
        """The deadline pushed one TTFT later per level of service the request's session has had."""
        level = self.sessions.level(seq.session.key, now) if seq.session is not None else 0
        return self.deadline(seq) + self.config.slo_class(seq.params.slo_class).ttft_s * level

    def order_waiting(self, waiting: deque[Sequence], now: float) -> None:
        if len(waiting) < 2:
            return
        groups: dict[tuple[bool, float], list[Sequence]] = {}
        for seq in waiting:
            groups.setdefault((self.is_vip(seq), self.config.slo_class(seq.params.slo_class).ttft_s), []).append(seq)
        keyed: list[tuple[bool, float, float, Sequence]] = []
        for (vip, _), seqs in groups.items():
            deadlines = sorted(self.deadline(s) for s in seqs)
            fair = sorted(seqs, key=lambda s: (self.fair_deadline(s, now), s.arrival_time))
            keyed += [(not vip, deadline, s.arrival_time, s) for deadline, s in zip(deadlines, fair, strict=True)]
        keyed.sort(key=lambda item: item[:3])
        waiting.clear()
        waiting.extend(item[3] for item in keyed)

    def order_running(self, running: list[Sequence]) -> None:
        if len(running) > 1:
            running.sort(key=lambda s: (_in_prefill(s), not self.is_vip(s), _remaining_steps(s)))

    def served(self, seq: Sequence, num_tokens: int, now: float) -> None:
        if seq.session is not None:
            self.sessions.add(seq.session.key, num_tokens, now)


def make_queue_policy(name: PolicyName, config: SloConfig) -> QueuePolicy:
    return SloPolicy(config) if name == "slo" else FcfsPolicy()


def _in_prefill(seq: Sequence) -> bool:
    """More than one token to compute: a prefill chunk (or a recompute after preemption), not a decode."""
    return seq.num_uncomputed_tokens > 1


def _remaining_steps(seq: Sequence) -> int:
    return seq.params.max_tokens - len(seq.output_token_ids)
