"""One campaign: agent sessions arrive (Poisson) for `duration_s` on the two replicas while the schedule's
faults strike at their share of the duration; then the sessions are audited in Redis and the KV blocks of
the disaggregated replica are checked against their idle level."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.progress import Progress

from agents_eval.bench.faults.audit import audit_sessions, kv_blocks_in_use, settled_kv_blocks
from agents_eval.bench.faults.deployment import Deployment
from agents_eval.bench.faults.sessions import Driver, Session, TurnOutcome

PROTOCOLS = ("responses", "chat", "ws")
SCHEDULE = ((0.15, "kill decode worker"), (0.3, "kill prefill worker"), (0.45, "kill redis"),
            (0.55, "restart redis"), (0.7, "SIGTERM replica 1"))


@dataclass(frozen=True)
class CampaignSettings:
    duration_s: float = 60.0
    sessions_per_s: float = 0.5
    turns: int = 4
    max_tokens: int = 12
    turn_budget_s: float = 60.0  # a turn is retried until this runs out
    drop_share: float = 0.1  # streamed first attempts the client drops mid-stream on purpose
    seed: int = 0


@dataclass
class CampaignResult:
    turns: list[TurnOutcome]
    sessions: list[Session]
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (seconds from start, what happened)
    audit: dict[str, int] = field(default_factory=dict)
    kv_blocks_idle: float = 0.0
    kv_blocks_after: float = 0.0
    start: float = 0.0  # time.monotonic() when the load began

    def figures(self) -> dict[str, Any]:
        outcomes = Counter(turn.outcome for turn in self.turns)
        attempts = [a for turn in self.turns for a in turn.attempts]
        return {
            "sessions": len(self.sessions), "turns": len(self.turns), "requests_sent": len(attempts),
            "completed": outcomes["completed"], "retried": len(attempts) - len(self.turns),
            "failed_clean": outcomes["failed"], "lost": outcomes["lost"] + self.audit.get("lost_update", 0),
            "duplicated": self.audit.get("unacknowledged", 0),
            "sessions_corrupted": self.audit.get("corrupted", 0) + self.audit.get("missing", 0),
            "kv_blocks_leaked": max(0, round(self.kv_blocks_after - self.kv_blocks_idle)),
            "attempt_outcomes": dict(Counter(attempts).most_common()),
        }


async def run_session(driver: Driver, http: httpx.AsyncClient, session: Session, turns: int,
                      rng: random.Random) -> None:
    for index in range(turns):
        if (await driver.run_turn(http, session, index)).outcome != "completed":
            return  # a session whose turn failed does not continue
        await asyncio.sleep(rng.uniform(0.1, 1.0))  # the tool runs


async def strike(deployment: Deployment, what: str) -> str:
    if what.startswith("kill") and what.endswith("worker"):
        return await asyncio.to_thread(deployment.kill_worker, what.split()[1])
    if what == "kill redis":
        deployment.redis.kill()
        return what
    if what == "restart redis":
        await asyncio.to_thread(deployment.redis.start)
        return what
    return deployment.stop_replica(1)


async def faults(deployment: Deployment, settings: CampaignSettings, start: float,
                 timeline: list[tuple[float, str]]) -> None:
    for share, what in SCHEDULE:
        await asyncio.sleep(max(0.0, start + share * settings.duration_s - time.monotonic()))
        timeline.append((time.monotonic() - start, await strike(deployment, what)))


async def campaign(deployment: Deployment, settings: CampaignSettings, progress: Progress) -> CampaignResult:
    rng = random.Random(settings.seed)
    urls = [replica.url for replica in deployment.replicas]
    driver = Driver(urls, settings.max_tokens, settings.turn_budget_s, settings.drop_share, rng, deployment.alive)
    async with httpx.AsyncClient(base_url=urls[0], timeout=30) as http:
        idle = await kv_blocks_in_use(http)
    result = CampaignResult(driver.turns, [])
    task = progress.add_task("faults campaign", total=settings.duration_s)
    start = result.start = time.monotonic()
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as http:
        fault_task = asyncio.create_task(faults(deployment, settings, start, result.timeline))
        running: list[asyncio.Task[None]] = []
        while (now := time.monotonic() - start) < settings.duration_s:
            number = len(result.sessions)
            session = Session(number, PROTOCOLS[number % 3], rng.randrange(2) if deployment.alive(1) else 0,
                              session_id=f"faults-{uuid.uuid4().hex[:12]}")
            result.sessions.append(session)
            running.append(asyncio.create_task(run_session(driver, http, session, settings.turns, rng)))
            await asyncio.sleep(rng.expovariate(settings.sessions_per_s))
            progress.update(task, completed=min(now, settings.duration_s))
        await fault_task
        await asyncio.gather(*running)
    progress.update(task, completed=settings.duration_s)
    result.audit = await audit_sessions(deployment.redis.url, result.sessions)
    result.kv_blocks_idle = idle
    result.kv_blocks_after = await settled_kv_blocks(urls[0], idle)
    return result
