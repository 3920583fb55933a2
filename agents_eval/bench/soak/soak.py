"""A soak: agent sessions arrive at a steady rate on one gateway for a long time (30 minutes by default),
with a short session TTL so sessions keep expiring; every `sample_s` the gateway's resident memory and open
file descriptors (its process and its children) and the turns' latency are sampled. Flat is the goal: the
slopes of memory, descriptors and latency over the run after its warm-up, fitted by least squares."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import psutil
from rich.progress import Progress

from agents_eval.bench.faults.campaign import PROTOCOLS, run_session
from agents_eval.bench.faults.sessions import Driver, Session
from agents_eval.harness.report import goal

WARMUP_SHARE = 0.25  # the first quarter of the samples is left out of the slopes
# Flat: over the samples after the warm-up, the fitted lines may add at most this many open descriptors
# (connections come and go) and this much resident memory.
FDS_GROWTH_BOUND = 8
RSS_GROWTH_BOUND_MB = 128.0
# ... and the turns' median latency at most this share of its own median over the run (it may not double)
LATENCY_GROWTH_BOUND = 1.0


@dataclass(frozen=True)
class SoakSettings:
    duration_s: float = 1800.0
    sessions_per_s: float = 0.5
    turns: int = 4
    max_tokens: int = 12
    sample_s: float = 10.0
    session_ttl_s: float = 30.0
    seed: int = 0
    max_in_flight: int = 0  # sessions running at once; an arrival beyond it is skipped (0: no bound, open loop)


@dataclass
class Sample:
    at_s: float
    rss_mb: float
    fds: int
    sessions: int
    turn_p50_ms: float | None  # of the turns completed since the last sample


@dataclass
class SoakResult:
    samples: list[Sample] = field(default_factory=list)
    turns: int = 0
    completed: int = 0
    skipped_arrivals: int = 0  # arrivals not started: max_in_flight sessions were running

    def window_h(self) -> float:
        """Hours the slopes are fitted over: the samples after the warm-up."""
        kept = self.samples[int(len(self.samples) * WARMUP_SHARE):]
        return (kept[-1].at_s - kept[0].at_s) / 3600 if len(kept) > 1 else 0.0

    def slopes_per_hour(self) -> dict[str, float | None]:
        """Least-squares slopes after the warm-up: MB/h, descriptors/h, ms/h (None: too few samples)."""
        kept = self.samples[int(len(self.samples) * WARMUP_SHARE):]
        hours = np.array([s.at_s / 3600 for s in kept])

        def slope(values: list[float]) -> float | None:
            return float(np.polyfit(hours[:len(values)], values, 1)[0]) if len(values) >= 3 else None

        latencies = [s for s in kept if s.turn_p50_ms is not None]
        return {"rss_mb_per_h": slope([s.rss_mb for s in kept]), "fds_per_h": slope([float(s.fds) for s in kept]),
                "turn_p50_ms_per_h": None if len(latencies) < 3 else float(np.polyfit(
                    [s.at_s / 3600 for s in latencies], [s.turn_p50_ms or 0.0 for s in latencies], 1)[0])}


def goals(result: SoakResult) -> list[dict[str, Any]]:
    """Flat: what the fitted lines add over the window after the warm-up, against the stated bounds; and no
    turn failed."""
    slopes, window_h = result.slopes_per_hour(), result.window_h()
    p50s = [s.turn_p50_ms for s in result.samples if s.turn_p50_ms is not None]
    latency = slopes["turn_p50_ms_per_h"]
    latency_growth = latency * window_h / statistics.median(p50s) if latency is not None and p50s else None
    return [goal("open descriptors added over the window (fitted)", FDS_GROWTH_BOUND, "max",
                 _over(slopes["fds_per_h"], window_h)),
            goal("resident MB added over the window (fitted)", RSS_GROWTH_BOUND_MB, "max",
                 _over(slopes["rss_mb_per_h"], window_h)),
            goal("turn p50 added over the window / its median (fitted)", LATENCY_GROWTH_BOUND, "max", latency_growth),
            goal("turns not completed", 0, "max", result.turns - result.completed)]


def _over(slope: float | None, window_h: float) -> float | None:
    return None if slope is None else slope * window_h


def process_tree(pid: int) -> tuple[float, int]:
    """Resident MB and open descriptors of a process and its children."""
    root = psutil.Process(pid)
    rss, fds = 0, 0
    for process in [root, *root.children(recursive=True)]:
        try:
            rss += process.memory_info().rss
            fds += process.num_fds()
        except psutil.NoSuchProcess:
            continue
    return rss / 2**20, fds


async def sessions_held(http: httpx.AsyncClient) -> int:
    for line in (await http.get("/metrics")).text.splitlines():
        if line.startswith("agentserve:num_sessions "):
            return int(float(line.split()[1]))
    return 0


async def sample(pid: int, http: httpx.AsyncClient, driver: Driver, seen: int, at_s: float) -> Sample:
    rss, fds = process_tree(pid)
    latencies = [t.latency_s * 1000 for t in driver.turns[seen:] if t.outcome == "completed"]
    return Sample(at_s, rss, fds, await sessions_held(http), statistics.median(latencies) if latencies else None)


def _room(running: list[asyncio.Task[None]], max_in_flight: int) -> bool:
    return not max_in_flight or sum(not task.done() for task in running) < max_in_flight


async def soak(url: str, pid: int, settings: SoakSettings, progress: Progress) -> SoakResult:
    rng = random.Random(settings.seed)
    driver = Driver([url, url], settings.max_tokens, 120.0, 0.0, rng, lambda _: True)
    result, seen = SoakResult(), 0
    running: list[asyncio.Task[None]] = []
    task = progress.add_task("soak", total=settings.duration_s)
    start = next_sample = next_arrival = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=200)) as http:
        while (now := time.monotonic()) - start < settings.duration_s:
            if now >= next_sample:
                result.samples.append(await sample(pid, http, driver, seen, now - start))
                seen, next_sample = len(driver.turns), next_sample + settings.sample_s
            if now >= next_arrival:
                if _room(running, settings.max_in_flight):
                    session = Session(len(running), PROTOCOLS[len(running) % 3], 0,
                                      session_id=f"soak-{uuid.uuid4().hex[:12]}")
                    running.append(asyncio.create_task(run_session(driver, http, session, settings.turns, rng)))
                else:
                    result.skipped_arrivals += 1
                next_arrival += rng.expovariate(settings.sessions_per_s)
            await asyncio.sleep(max(0.0, min(next_arrival, next_sample) - time.monotonic()))
            progress.update(task, completed=min(time.monotonic() - start, settings.duration_s))
        await asyncio.gather(*running)
        result.samples.append(await sample(pid, http, driver, seen, time.monotonic() - start))
    result.turns, result.completed = len(driver.turns), sum(t.outcome == "completed" for t in driver.turns)
    return result
