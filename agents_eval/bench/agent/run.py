"""One measured point of `agentserve bench --workload`: one configuration's own gateway process, warmed up,
then the workload driven through it while the prefill/decode split is polled, with the gateway's counters
read before and after. The configuration decides the client (agent_bench_configs): without sessions it
resends the whole history over chat completions without a session id; with them it keeps each session
(Responses WebSocket, or chat completions with `X-Session-Id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop
from rich.progress import Progress

from agents_eval.bench.agent.configs import COMMON_ENV, CONFIGS
from agents_eval.bench.agent.gateway import RolePoller, capacity, colocated_threads, deployment_workers
from agents_eval.bench.agent.workload import warm_up_workload
from agents_eval.harness.client import HttpPool
from agents_eval.harness.drive import (
    OpenSession,
    RunLimits,
    WorkloadLike,
    chat_opener,
    drive,
    planned_requests,
    ws_opener,
)
from agents_eval.harness.report import finite
from agents_eval.harness.servers.gateway import counter_deltas, model_name, running_gateway, scrape
from agents_eval.harness.servers.process import ServerProcess
from agents_eval.harness.stats import RequestRecord
from engine.gc_heap import heap_frozen

WS, HTTP = "ws", "http"
ADMIN_TIMEOUT_S = 10.0
SETTLE_S = 0.5  # disaggregated workers report their cache counters when they turn idle: let the last arrive


@dataclass(frozen=True)
class RunOptions:
    model: str = "tiny"
    client: str = WS  # the agent configuration's session client
    limits: RunLimits = field(default_factory=lambda: RunLimits(duration_s=60.0))
    warm_up_turns: int = 3
    env: Mapping[str, str] = field(default_factory=dict)  # the user's --env overrides, applied last


@dataclass
class PointResult:
    """What one configuration at one offered rate measured."""

    config: str
    records: list[RequestRecord]
    session_errors: list[str]
    deltas: dict[str, float]  # /metrics counters, after minus before
    capacity: dict[str, Any]  # the split at the end, its events, where it was read
    timeline: list[tuple[float, dict[str, int]]]
    env: dict[str, str]
    model_name: str

    @property
    def workers(self) -> int:
        return sum(self.capacity["split"].values()) or 1


@dataclass(frozen=True)
class Point:
    """One configuration measured at one offered rate."""

    config: str
    tag: str  # "x<fraction of --rate>", or "probe<n>" of the SLO-rate search
    offered_rate: float  # sessions/s
    result: PointResult
    headline: bool = False  # the configuration's figures in the table: at --rate, or at its SLO rate


def measure_point(config: str, tag: str, rate: float, workload: WorkloadLike, options: RunOptions, out_dir: Path,
                  progress: Progress) -> Point:
    """One point on a fresh gateway, its requests on a progress bar; the log in `logs/gateway-<config>-<tag>.log`,
    its records in `requests/<config>-<tag>.jsonl`."""
    task = progress.add_task(f"{config} @ {rate:.3g} sessions/s", total=planned_requests(workload, options.limits),
                             note="errors 0")
    errors = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal errors
        errors += not record.ok
        progress.update(task, advance=1, note=f"errors {errors}")

    result = run_point(config, workload, options, out_dir / "logs" / f"gateway-{config}-{tag}.log", on_record)
    progress.update(task, total=len(result.records), completed=len(result.records))
    point = Point(config, tag, rate, result)
    write_records(out_dir / "requests", point)
    return point


def write_records(folder: Path, point: Point) -> None:
    """Every request of the point, one JSON object a line, `requests/<config>-<point>.jsonl`, written as the point
    ends: a run cut short (a timeout, Ctrl-C, a lost machine) keeps every point it finished."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(finite(asdict(r))) for r in point.result.records]
    (folder / f"{point.config}-{point.tag}.jsonl").write_text("".join(f"{line}\n" for line in lines))


def gateway_env(config: str, user_env: Mapping[str, str]) -> dict[str, str]:
    """The configuration's switches; a colocated engine gets the torch threads the disaggregated workers use in
    all. The user's overrides come last."""
    spec = CONFIGS[config]
    env = {**COMMON_ENV, **spec.env()}
    if spec.replicas:  # the disaggregated configurations' workers, each a colocated engine: no prefill worker
        env |= {"AGENTSERVE_DEPLOYMENT_PREFILL": "0", "AGENTSERVE_DEPLOYMENT_DECODE": str(deployment_workers(user_env))}
    elif not spec.disaggregated:
        env["AGENTSERVE_ENGINE_NUM_THREADS"] = str(colocated_threads(user_env))
    return {**env, **user_env}


def session_opener(config: str, client: str, model: str, pool: HttpPool, openai_client: Any) -> OpenSession:
    if not CONFIGS[config].sessions:
        return chat_opener(pool, model, session_ids=False)
    if client == HTTP:
        return chat_opener(pool, model, session_ids=True)
    return ws_opener(openai_client, model)


def run_point(config: str, workload: WorkloadLike, options: RunOptions, log_path: Path,
              on_record: Callable[[RequestRecord], None]) -> PointResult:
    """Start the configuration's gateway, measure, stop it. The client runs on uvloop, as the gateway does: it
    shares the host's cores with the configuration it measures, so what it spends is taken from them."""
    env = gateway_env(config, options.env)
    with running_gateway(options.model, env, log_path) as gateway:
        return uvloop.run(_measure(config, gateway, workload, options, on_record))


async def _measure(config: str, gateway: ServerProcess, workload: WorkloadLike, options: RunOptions,
                   on_record: Callable[[RequestRecord], None]) -> PointResult:
    import openai

    pool = HttpPool(gateway.url, options.limits.request_timeout_s)
    openai_client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0,
                                       timeout=options.limits.request_timeout_s)
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=ADMIN_TIMEOUT_S) as admin:
            name = await model_name(admin)
            opener = session_opener(config, options.client, name, pool, openai_client)
            await _warm_up(opener, options)
            before = await scrape(admin)
            poller = RolePoller(admin)
            polling = asyncio.create_task(poller.run())
            with heap_frozen():
                result = await drive(workload, opener, options.limits, on_record)
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling
            await asyncio.sleep(SETTLE_S)
            after, split = await scrape(admin), await capacity(admin)
    finally:
        await pool.close()
        await openai_client.close()
    deltas = counter_deltas(before["counters"], after["counters"])
    return PointResult(config, result.records, result.session_errors, deltas, split, poller.timeline,
                       gateway.env, name)


async def _warm_up(opener: OpenSession, options: RunOptions) -> None:
    if options.warm_up_turns < 1:
        return
    limits = RunLimits(duration_s=options.limits.request_timeout_s, request_timeout_s=options.limits.request_timeout_s)
    result = await drive(warm_up_workload(options.warm_up_turns), opener, limits, lambda record: None)
    failures = [r.error for r in result.records if r.error] + result.session_errors
    if failures or len(result.records) < options.warm_up_turns:
        raise RuntimeError(f"the gateway failed its warm-up: {failures or 'too few replies'}")
