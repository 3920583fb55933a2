"""The line in front of admission control. A request the controller cannot admit yet waits its turn instead
of being refused at once, as vLLM's, SGLang's and llama-server's queues let it: requests are admitted in the
order they first arrived, and a request waits only while its wait so far plus the work ahead would still fit
the TTFT budget (the SLO's headroom share). Past that it is refused with 503 and a Retry-After, as before: the
server is over its capacity then, not merely busy.

A refused request keeps its place: its key (the session, or the prompt's hash) remembers when it first
arrived, and its retry lines up by that time, ahead of the requests that came after it. Without this, a
retry is a new arrival, and under a closed loop of agents the same turn can lose the race every time (issue
49: one turn refused 76 times, 663 s).

Waiters are woken when the admitted work changes (a first token, a finish) and at the controller's
Retry-After, when the head's estimated progress alone may have made room. Asyncio on the gateway's loop; the
clock is injected."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gateway.admission.controller import AdmissionController, AdmissionDecision

REMEMBER_S = 600.0  # how long a refused request's first arrival is kept for its retry
REMEMBER_MAX = 4096  # keys kept at most (the oldest forgotten first)
MIN_POLL_S = 0.05  # the shortest sleep between two looks at the head's progress


@dataclass(order=True)
class _Waiter:
    arrival: float
    order: int
    woken: asyncio.Event = field(compare=False, default_factory=asyncio.Event)


class AdmissionQueue:
    def __init__(self, controller: AdmissionController, clock: Callable[[], float] = time.monotonic) -> None:
        self.controller = controller
        self._clock = clock
        self._waiters: list[_Waiter] = []  # in admission order: first arrival, then order of joining
        self._first_arrival: OrderedDict[str, float] = OrderedDict()  # refused key -> when it first arrived
        self._joined = itertools.count()
        controller.subscribe(self._wake_head)

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    async def admit(self, request_id: str, prompt_tokens: int, key: str | None = None, decode_tokens: int = 0,
                    streams: int = 1) -> AdmissionDecision:
        """Admitted (the controller's `on_admit` done), or refused once the wait would break the TTFT budget."""
        now = self._clock()
        waiter = _Waiter(self._recall(key, now), next(self._joined))
        self._insert(waiter)
        try:
            decision = await self._wait_turn(waiter, now, prompt_tokens, streams)
        finally:
            self._waiters.remove(waiter)
            self._wake_head()
        if decision.admit:
            self.controller.on_admit(request_id, prompt_tokens, decode_tokens, streams)
        elif key is not None:
            self._remember(key, waiter.arrival)
        return decision

    async def _wait_turn(self, waiter: _Waiter, sent: float, prompt_tokens: int, streams: int) -> AdmissionDecision:
        """At the head, the controller's decision with the budget the wait since `sent` left; a refusal once the
        budget is spent (its Retry-After as a new request's would be)."""
        headroom = self.controller.headroom
        while True:
            left_s = headroom * self.controller.slo_s - (self._clock() - sent)  # of the TTFT budget
            nap = left_s
            if self._waiters[0] is waiter:
                decision = self.controller.check(prompt_tokens, max(0.0, left_s / headroom), streams)
                if decision.admit:
                    return decision
                nap = min(max(decision.retry_after_s, MIN_POLL_S), left_s)
            if left_s <= 0:
                return self._refusal(prompt_tokens, streams)
            await self._sleep(waiter, nap)

    def _refusal(self, prompt_tokens: int, streams: int) -> AdmissionDecision:
        """As a new request would be answered now, refused even where it would fit (it waited its budget)."""
        decision = self.controller.check(prompt_tokens, streams=streams)
        reason = decision.reason if decision.reason != "admitted" else "ttft_slo"
        return replace(decision, admit=False, reason=reason, retry_after_s=max(decision.retry_after_s, MIN_POLL_S))

    def _insert(self, waiter: _Waiter) -> None:
        self._waiters.append(waiter)
        self._waiters.sort()

    async def _sleep(self, waiter: _Waiter, seconds: float) -> None:
        waiter.woken.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.woken.wait(), seconds)

    def _wake_head(self) -> None:
        if self._waiters:
            self._waiters[0].woken.set()

    def _recall(self, key: str | None, now: float) -> float:
        """When this key's request first arrived, if it was refused within `REMEMBER_S`; else now."""
        if key is None:
            return now
        first = self._first_arrival.pop(key, None)
        return first if first is not None and now - first <= REMEMBER_S else now

    def _remember(self, key: str, arrival: float) -> None:
        self._first_arrival[key] = arrival
        self._first_arrival.move_to_end(key)
        while len(self._first_arrival) > REMEMBER_MAX:
            self._first_arrival.popitem(last=False)
