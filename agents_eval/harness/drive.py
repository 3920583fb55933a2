"""The session drivers: `drive` runs a workload's agent sessions against a gateway, open loop, and records
every request sent; `closed_loop` runs items with a fixed number in flight.

Sessions arrive at their `start_s` and run as concurrent asyncio tasks. Within a session each turn waits for
the previous reply, then for its tool gap (`tool_gap_s`), or, in a trace replay, until its `at_s` when that
is later. No turn is sent after `duration_s` or past `max_requests`; requests already sent then get
`drain_timeout_s` to finish, and one still running at that deadline is recorded as an error. A request refused
with 429 or 503 and a `Retry-After` is sent again after that many seconds (at most `max_retry_wait_s`), as
real clients do, up to `retries` times; each refused attempt is recorded (with its status), and the attempt
that completes records its `retries` and the seconds `waited_s` since the turn's first send. Any other failed
request, or a refusal past the retries, ends its session (its next turn would need the reply). Every wait is
bounded.

The driver reads workloads structurally (`WorkloadLike`: `agents_eval.workloads.types.Workload` fits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agents_eval.harness.client import ChatSession, HttpPool, SessionClient, TurnInput, WsSession
from agents_eval.harness.stats import RequestRecord

REFUSALS = (429, 503)  # overload is answered with one of these and a Retry-After


class TurnLike(TurnInput, Protocol):
    @property
    def at_s(self) -> float | None: ...
    @property
    def tool_gap_s(self) -> float: ...
    @property
    def phase(self) -> str: ...


class SessionLike(Protocol):
    @property
    def session_id(self) -> str: ...
    @property
    def start_s(self) -> float: ...
    @property
    def system(self) -> str: ...
    @property
    def turns(self) -> Sequence[TurnLike]: ...


class WorkloadLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def sessions(self) -> Sequence[SessionLike]: ...


OpenSession = Callable[[SessionLike], AbstractAsyncContextManager[SessionClient]]
OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class RunLimits:
    duration_s: float
    max_requests: int | None = None
    request_timeout_s: float = 120.0
    drain_timeout_s: float = 60.0
    retries: int = 0  # times a turn refused with Retry-After is sent again
    max_retry_wait_s: float = 30.0


class Clock:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def sleep_until(self, at_s: float) -> None:
        await asyncio.sleep(max(0.0, at_s - self.now()))


class Budget:
    """Whether one more request may be sent: before the duration's end and within `max_requests`."""

    def __init__(self, limits: RunLimits, clock: Clock) -> None:
        self.limits, self.clock, self.sent = limits, clock, 0

    def take(self) -> bool:
        over = self.limits.max_requests is not None and self.sent >= self.limits.max_requests
        if over or self.clock.now() >= self.limits.duration_s:
            return False
        self.sent += 1
        return True


def chat_opener(pool: HttpPool, model: str, session_ids: bool) -> OpenSession:
    """Each session on the chat client: with `session_ids`, under the session's id (`X-Session-Id`: the gateway
    keeps the session); without, stateless (the whole history resent)."""
    @asynccontextmanager
    async def open_session(script: SessionLike) -> AsyncIterator[SessionClient]:
        yield ChatSession(pool, model, script.system, script.session_id if session_ids else None)

    return open_session


def ws_opener(openai_client: Any, model: str) -> OpenSession:
    """Each session on a Responses WebSocket of its own (`openai_client.responses.connect()`)."""
    @asynccontextmanager
    async def open_session(script: SessionLike) -> AsyncIterator[SessionClient]:
        async with openai_client.responses.connect() as connection:
            yield WsSession(connection, model, script.system)

    return open_session


def progress_display() -> Progress:
    """A progress bar per driven run: description, bar, requests done of `planned_requests`, a note, time."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[note]}"), TimeElapsedColumn())


def planned_requests(workload: WorkloadLike, limits: RunLimits) -> int:
    """The requests the run would send if every session kept up: the progress bar's total."""
    turns = sum(len(s.turns) for s in workload.sessions if s.start_s < limits.duration_s)
    return turns if limits.max_requests is None else min(turns, limits.max_requests)


@dataclass
class SessionRun:
    script: SessionLike
    clock: Clock
    budget: Budget
    limits: RunLimits
    on_record: OnRecord
    session_errors: list[str]

    async def run(self, open_session: OpenSession) -> None:
        if not self.script.turns or self.script.start_s >= self.limits.duration_s:
            return
        await self.clock.sleep_until(self.script.start_s)
        try:
            async with open_session(self.script) as client:
                await self._turns(client)
        except Exception as error:  # opening or closing the session's connection failed
            self.session_errors.append(f"{self.script.session_id}: {_describe(error)}")

    async def _turns(self, client: SessionClient) -> None:
        for index, turn in enumerate(self.script.turns):
            due = self.clock.now() + turn.tool_gap_s if turn.at_s is None else max(turn.at_s, self.clock.now())
            if due >= self.limits.duration_s:  # never sleep past the end
                return
            await self.clock.sleep_until(due)
            if not self.budget.take() or not await self._send(client, index):
                return

    async def _send(self, client: SessionClient, index: int) -> bool:
        first = self.clock.now()
        for attempt in range(self.limits.retries + 1):
            sent = self.clock.now()
            try:
                async with asyncio.timeout(self.limits.request_timeout_s):
                    reply = await client.send(self.script.turns[index])
            except asyncio.CancelledError:
                self._record(index, sent, error="still running at the drain deadline")
                raise
            except Exception as error:  # counted as this request's error
                status, retry_after = getattr(error, "status", None), getattr(error, "retry_after", None)
                self._record(index, sent, _describe(error), status, retry_after)
                wait = retry_wait(status, retry_after, self.limits.max_retry_wait_s)
                if wait is None or attempt == self.limits.retries or not await self._wait(wait):
                    return False
                continue
            self.on_record(RequestRecord(self.script.session_id, index, self.script.turns[index].phase, sent,
                                         reply.ttft_s, reply.e2e_s, reply.prompt_tokens, reply.cached_tokens,
                                         reply.output_tokens, retries=attempt, waited_s=sent - first))
            return True
        return False

    async def _wait(self, seconds: float) -> bool:
        """Sleep before a retry; False when the run would end first."""
        if self.clock.now() + seconds >= self.limits.duration_s:
            return False
        await asyncio.sleep(seconds)
        return True

    def _record(self, index: int, sent: float, error: str, status: int | None = None,
                retry_after: str | None = None) -> None:
        phase = self.script.turns[index].phase
        self.on_record(RequestRecord(self.script.session_id, index, phase, sent, e2e_s=self.clock.now() - sent,
                                     error=error, status=status, retry_after=retry_after))


def retry_wait(status: int | None, retry_after: str | None, max_wait_s: float) -> float | None:
    """Seconds to wait before sending a refused request again: its Retry-After (seconds), at most `max_wait_s`;
    None when the failure is not a refusal with a Retry-After a client can read."""
    if status not in REFUSALS or not retry_after:
        return None
    try:
        return min(max(0.0, float(retry_after)), max_wait_s)
    except ValueError:  # an HTTP date: not what the gateway sends
        return None


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text[:500]


@dataclass
class DriveResult:
    records: list[RequestRecord]  # in the order the requests finished
    session_errors: list[str]  # failures outside any request: a WebSocket that would not open


async def drive(workload: WorkloadLike, open_session: OpenSession, limits: RunLimits,
                on_record: OnRecord) -> DriveResult:
    """Every session of the workload, concurrently."""
    records: list[RequestRecord] = []
    session_errors: list[str] = []

    def record(item: RequestRecord) -> None:
        records.append(item)
        on_record(item)

    clock = Clock()
    budget = Budget(limits, clock)
    runs = [SessionRun(s, clock, budget, limits, record, session_errors) for s in workload.sessions]
    tasks = [asyncio.create_task(run.run(open_session)) for run in runs]
    await settle(tasks, limits.duration_s + limits.drain_timeout_s)
    return DriveResult(records, session_errors)


async def settle(tasks: Sequence[asyncio.Task[Any]], timeout_s: float) -> None:
    """Wait up to `timeout_s` for the tasks; cancel those still running then, and wait for them to end."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def closed_loop(count: int, concurrency: int, one: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """`concurrency` workers, each starting its next item as soon as its last one is done; results in item order."""
    results: list[Any] = [None] * count
    indices = iter(range(count))

    async def worker() -> None:
        for index in indices:
            results[index] = await one(index)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return results
