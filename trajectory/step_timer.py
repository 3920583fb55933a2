"""Where one request's time goes, step by step, for `agentserve bench gateway`: wall-clock probes
(`time.perf_counter_ns`) that cost one context-variable read when no timer is on.

A benchmark turns a timer on for one request (`timing()` in the task that serves it); the code under
test marks steps with `enter(name)` and `leave(name)`. Steps nest: time goes to the innermost step open,
so an outer step (waiting for the engine, say) is paused while an inner one (handling an output) runs.
`leave` closes every step opened after `name` too, so a step skipped by an exception cannot skew the rest.
"""

from __future__ import annotations

from contextvars import ContextVar
from time import perf_counter_ns

_CURRENT: ContextVar[StepTimes | None] = ContextVar("agentserve_step_times", default=None)


class StepTimes:
    """Nanoseconds per step of one request, from `start` on; `outside` collects time no step holds."""

    def __init__(self, outside: str) -> None:
        self.ns: dict[str, int] = {}
        self._open = [outside]
        self._since = perf_counter_ns()

    def enter(self, name: str) -> None:
        self._charge()
        self._open.append(name)

    def leave(self, name: str) -> None:
        if name not in self._open[1:]:
            return
        self._charge()
        while self._open.pop() != name:
            pass

    def finish(self) -> dict[str, int]:
        """Every step's total; the timer keeps counting only what no step holds."""
        self._charge()
        del self._open[1:]
        return dict(self.ns)

    def _charge(self) -> None:
        now = perf_counter_ns()
        step = self._open[-1]
        self.ns[step] = self.ns.get(step, 0) + now - self._since
        self._since = now


def timing(outside: str) -> StepTimes:
    """Time the rest of the current task (and the tasks it starts) by steps."""
    times = StepTimes(outside)
    _CURRENT.set(times)
    return times


def enter(name: str) -> None:
    times = _CURRENT.get()
    if times is not None:
        times.enter(name)


def leave(name: str) -> None:
    times = _CURRENT.get()
    if times is not None:
        times.leave(name)
