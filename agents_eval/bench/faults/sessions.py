"""The campaign's clients: agent sessions of several turns over three protocols (Responses over HTTP with
`previous_response_id`, chat completions streamed with `X-Session-Id` and the whole history, and the Responses
WebSocket), each turn retried on the other replica or after `Retry-After` until it completes or its time
budget runs out. Every attempt is recorded; a turn ends completed, failed with a clean (OpenAI-shaped) error,
or lost (no answer at all)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets
from websockets.asyncio.client import connect

from agents_eval.harness.client import RawWebSocket, RequestFailed, WsSession, chat_chunks, post_json, ws_url
from agents_eval.workloads.types import ACT, APPEND, Turn

RETRY_STATUSES = (429, 502, 503)
ABANDONED = "abandoned"  # the client dropped the stream on purpose (a fault of the campaign)


class CleanError(Exception):
    """An answer in OpenAI's error shape that retrying will not change."""


class Retry(Exception):
    def __init__(self, reason: str, after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.after_s = after_s


@dataclass
class TurnOutcome:
    """What became of one turn: each attempt's outcome and when it ended, the final outcome, the latency."""

    session: int
    index: int
    attempts: list[str] = field(default_factory=list)  # the outcome of each attempt
    attempt_times: list[float] = field(default_factory=list)  # when each attempt ended (time.monotonic)
    outcome: str = "lost"  # completed | failed | lost
    latency_s: float = 0.0


@dataclass
class Session:
    number: int
    protocol: str  # responses | chat | ws
    replica: int  # the replica its turns go to first
    messages: list[dict[str, Any]] = field(default_factory=list)  # chat: the history as the client has it
    last_response: str | None = None  # responses and ws: the latest response id
    completed: int = 0
    session_id: str = ""


@contextlib.contextmanager
def classified() -> Iterator[None]:
    """The harness client's failure as the campaign counts it: a refusal or an in-stream error is retried (after
    its Retry-After), any other OpenAI-shaped answer is a clean error."""
    try:
        yield
    except RequestFailed as failed:
        if failed.status is None:
            raise Retry(f"stream error {failed.code}") from failed
        label = f"{failed.status} {failed.code or 'not OpenAI-shaped'}"
        if failed.status in RETRY_STATUSES:
            raise Retry(label, float(failed.retry_after or 0.5)) from failed
        raise CleanError(label) from failed


async def responses_turn(http: httpx.AsyncClient, url: str, session: Session, text: str, tokens: int) -> None:
    body = {"model": "tiny", "input": text, "max_output_tokens": tokens, "temperature": 0,
            **({"previous_response_id": session.last_response} if session.last_response else {})}
    with classified():
        session.last_response = (await post_json(http, f"{url}/v1/responses", body))["id"]


async def chat_turn(http: httpx.AsyncClient, url: str, session: Session, text: str, tokens: int,
                    drop: bool) -> None:
    messages = [*session.messages, {"role": "user", "content": text}]
    body = {"model": "tiny", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True}
    reply: list[str] = []
    with classified():
        async for chunk in chat_chunks(http, body, {"X-Session-Id": session.session_id},
                                       f"{url}/v1/chat/completions"):
            if drop:
                raise Retry(ABANDONED)  # leaving the block closes the connection mid-stream
            reply.extend(choice["delta"].get("content") or "" for choice in chunk.get("choices", []))
    session.messages = [*messages, {"role": "assistant", "content": "".join(reply)}]


async def ws_turn(url: str, session: Session, text: str, tokens: int, drop: bool) -> None:
    """One turn on a WebSocket of its own, continuing the session's latest response (any replica's)."""
    async with connect(ws_url(url), open_timeout=10) as ws:
        client = WsSession(RawWebSocket(ws), "tiny", "", session.last_response)
        if drop:
            client.on_delta = _abandon
        with classified():
            await client.send(Turn(None, 0.0, ({"role": "user", "content": text},), 0, tokens, ACT, APPEND))
    session.last_response = client.previous_id


def _abandon(_: str) -> None:
    raise Retry(ABANDONED)  # leaving the block closes the connection mid-stream


@dataclass
class Driver:
    urls: list[str]
    tokens: int
    budget_s: float
    drop_share: float
    rng: random.Random
    alive: Callable[[int], bool]  # whether a replica still takes requests (the campaign stops one)
    turns: list[TurnOutcome] = field(default_factory=list)

    async def run_turn(self, http: httpx.AsyncClient, session: Session, index: int) -> TurnOutcome:
        turn, start = TurnOutcome(session.number, index), time.monotonic()
        text = f"Step {index}: the tool printed {self.rng.randrange(10**6)} lines; what next?"
        replica, first = session.replica, True
        while turn.outcome == "lost" and time.monotonic() - start < self.budget_s:
            if not self.alive(replica):
                replica = 1 - replica
            drop, first = first and self.rng.random() < self.drop_share, False
            label, pause_s = await self._try(http, replica, session, text, drop)
            turn.attempts.append(label)
            turn.attempt_times.append(time.monotonic())
            if label == "200":
                turn.outcome, session.completed = "completed", session.completed + 1
            elif pause_s is None:
                turn.outcome = "failed"
            else:
                replica = replica if label == ABANDONED else 1 - replica
                await asyncio.sleep(pause_s)
        turn.latency_s = time.monotonic() - start
        self.turns.append(turn)
        return turn

    async def _try(self, http: httpx.AsyncClient, replica: int, session: Session, text: str,
                   drop: bool) -> tuple[str, float | None]:
        """One attempt: its outcome, and how long to wait before the next (None: do not retry)."""
        try:
            await self._attempt(http, self.urls[replica], session, text, drop)
        except Retry as retry:
            return str(retry), min(retry.after_s, 2.0)
        except CleanError as error:
            return str(error), None
        except (TimeoutError, httpx.HTTPError, OSError, websockets.WebSocketException) as error:
            return f"transport {type(error).__name__}", 0.2
        return "200", None

    async def _attempt(self, http: httpx.AsyncClient, url: str, session: Session, text: str, drop: bool) -> None:
        if session.protocol == "responses":
            await responses_turn(http, url, session, text, self.tokens)
        elif session.protocol == "chat":
            await chat_turn(http, url, session, text, self.tokens, drop)
        else:
            await ws_turn(url, session, text, self.tokens, drop)
