"""The open-loop session driver on hand-built workloads: every turn sent, the duration and max_requests kept, a
failure ending its session, a refusal retried after its Retry-After (bounded), and the closed-loop runner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agents_eval.harness.client import Reply, RequestFailed, SessionClient
from agents_eval.harness.drive import RunLimits, SessionLike, closed_loop, drive, retry_wait
from agents_eval.workloads.types import APPEND, LAST_ACTION, SessionScript, Turn, Workload


@dataclass
class EchoClient:
    """Stands in for the gateway in driver tests: replies at once, or fails on the turns it is told to."""

    fail_turns: tuple[int, ...] = ()
    sent: int = 0

    async def send(self, turn: Any) -> Reply:
        self.sent += 1
        await asyncio.sleep(0)
        if self.sent - 1 in self.fail_turns:
            raise RuntimeError("gateway said no")
        return Reply("ok", 0.001, 0.002, 10, 0, turn.max_output_tokens)


def script(session_id: str, start_s: float, turns: int, gap_s: float = 0.0, history: str = APPEND) -> SessionScript:
    steps = tuple(Turn(start_s if i == 0 else None, gap_s if i else 0.0, ({"role": "user", "content": f"t{i}"},), 2,
                       3, "act", history) for i in range(turns))
    return SessionScript(session_id, start_s, "sys", steps)


def run_driver(sessions: tuple[SessionScript, ...], limits: RunLimits, fail_turns: tuple[int, ...] = ()) -> Any:
    @asynccontextmanager
    async def open_session(_: SessionLike) -> AsyncIterator[SessionClient]:
        yield EchoClient(fail_turns)

    return asyncio.run(drive(Workload("hand-built", sessions, {}), open_session, limits, lambda r: None))


def test_driver_sends_every_turn_and_stops_at_max_requests() -> None:
    sessions = (script("a", 0.0, 3), script("b", 0.01, 2))
    result = run_driver(sessions, RunLimits(duration_s=5.0))
    assert sorted((r.session_id, r.turn) for r in result.records) == [("a", 0), ("a", 1), ("a", 2), ("b", 0),
                                                                        ("b", 1)]
    assert all(r.ok and r.output_tokens == 3 for r in result.records)
    assert len(run_driver(sessions, RunLimits(duration_s=5.0, max_requests=3)).records) == 3


def test_driver_sends_nothing_due_after_the_duration() -> None:
    sessions = (script("early", 0.0, 5, gap_s=0.05), script("late", 30.0, 2))
    result = run_driver(sessions, RunLimits(duration_s=0.12, drain_timeout_s=1.0))
    assert {r.session_id for r in result.records} == {"early"}
    assert 1 <= len(result.records) < 5


def test_driver_counts_a_failed_request_and_ends_its_session() -> None:
    result = run_driver((script("a", 0.0, 4, history=LAST_ACTION),), RunLimits(duration_s=5.0), fail_turns=(1,))
    assert [(r.turn, r.ok) for r in result.records] == [(0, True), (1, False)]
    assert result.records[1].error == "RuntimeError: gateway said no"
    assert sum(not r.ok for r in result.records) == 1


@dataclass
class RefusingClient:
    """Refuses its first `refusals` requests with 429 and `Retry-After: retry_after`, then replies."""

    refusals: int
    retry_after: str | None = "0"
    sent: int = 0

    async def send(self, turn: Any) -> Reply:
        self.sent += 1
        await asyncio.sleep(0)
        if self.sent <= self.refusals:
            raise RequestFailed("HTTP 429: busy", 429, self.retry_after)
        return Reply("ok", 0.001, 0.002, 10, 0, turn.max_output_tokens)


def run_refused(refusals: int, limits: RunLimits, retry_after: str | None = "0") -> Any:
    @asynccontextmanager
    async def open_session(_: SessionLike) -> AsyncIterator[SessionClient]:
        yield RefusingClient(refusals, retry_after)

    workload = Workload("hand-built", (script("a", 0.0, 2),), {})
    return asyncio.run(drive(workload, open_session, limits, lambda r: None))


def test_a_refused_turn_is_sent_again_after_its_retry_after_and_each_attempt_is_recorded() -> None:
    result = run_refused(2, RunLimits(duration_s=30.0, retries=3))
    assert [(r.turn, r.status, r.ok) for r in result.records] == [(0, 429, False), (0, 429, False), (0, None, True),
                                                                  (1, None, True)]
    assert result.records[2].retries == 2 and result.records[2].waited_s >= 0.0
    assert result.records[3].retries == 0


def test_retries_are_bounded_and_a_refusal_past_them_ends_the_session() -> None:
    result = run_refused(5, RunLimits(duration_s=30.0, retries=2))
    assert [(r.turn, r.status) for r in result.records] == [(0, 429)] * 3


def test_a_refusal_without_retry_after_or_with_retries_off_is_not_retried() -> None:
    assert len(run_refused(1, RunLimits(duration_s=30.0, retries=3), retry_after=None).records) == 1
    assert len(run_refused(1, RunLimits(duration_s=30.0)).records) == 1


def test_the_wait_is_the_retry_after_capped_and_only_for_refusals() -> None:
    assert retry_wait(429, "2", 30.0) == 2.0 and retry_wait(503, "90", 30.0) == 30.0
    assert retry_wait(500, "2", 30.0) is None and retry_wait(429, None, 30.0) is None
    assert retry_wait(429, "Wed, 21 Oct 2026 07:28:00 GMT", 30.0) is None


def test_the_closed_loop_keeps_its_results_in_item_order() -> None:
    async def one(index: int) -> int:
        await asyncio.sleep(0.001 * (5 - index))
        return index * 10

    assert asyncio.run(closed_loop(5, 2, one)) == [0, 10, 20, 30, 40]
