"""`agentserve bench gateway`: what the gateway costs on top of its engine, and what the Responses WebSocket
mode saves an agent session against chat completions that resend the whole history.

1. Overhead (`gateway_bench_overhead`): the same short greedy chat requests through the gateway's engine
   alone and through the gateway over HTTP (aiohttp), at each concurrency level; p50/p99 and their gap.
2. Session (`gateway_bench_session`): a multi-turn agent session over `client.responses.connect()` with
   `previous_response_id`, and the same session over HTTP chat completions without a session id.

One gateway (uvicorn in a thread of this process, `gateway_bench_server`) on the chosen model serves both;
the clients run in a separate process (`gateway_bench_client`), so their work never holds this one's GIL.
Results go to `report.json`, `report.md` and `turn_latency.png` in the output folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agents_eval.bench.gateway import report as bench_report
from agents_eval.bench.gateway import steps as bench_steps
from agents_eval.bench.gateway.client import ClientProcess
from agents_eval.bench.gateway.overhead import measure_overhead
from agents_eval.bench.gateway.server import RunningGateway, running_gateway
from agents_eval.bench.gateway.session import Session, make_session, run_sessions, session_tokens
from agents_eval.report import ReportFiles, check_settings, machine_info, write_report
from engine.config import EngineSettings
from engine.core.async_engine import ServingEngine
from engine.core.llm_engine import LLMEngine
from engine.workers.coordinator.worker_engine import WorkerEngine, colocated_engine
from gateway.settings import GatewaySettings
from trajectory.template.default import load_chat_template

WARM_UP_TURNS = 3
ADMIT_ALL_SLO_S = 1e9
INT_OPTIONS = ("requests", "turns", "sessions", "rounds", "seed")


@dataclass(frozen=True)
class GatewayBenchSettings:
    model: str = "tiny"
    requests: int = 64  # per concurrency level, path and round
    concurrency: tuple[int, ...] = (1, 64)
    rounds: int = 4  # per level: each round runs every request through both paths
    max_tokens: int = 8
    turns: int = 20
    sessions: int = 3  # per mode; the per-turn curve is their mean
    observation_tokens: tuple[int, int] = (50, 70)  # 20 turns of these fit the tiny model's 2048 tokens
    seed: int = 0
    num_threads: int = 0  # torch threads of the engine; 0: torch's default (every core)
    engine_in_process: bool = False  # the engine on a thread of the gateway (the old model) instead of a process

    def validate(self) -> None:
        low, high = self.observation_tokens
        checks = [
            (self.requests >= 1, "--requests must be at least 1"),
            (bool(self.concurrency) and min(self.concurrency) >= 1, "--concurrency levels must be at least 1"),
            (self.rounds >= 1, "--rounds must be at least 1"),
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.turns >= 1, "--turns must be at least 1"),
            (self.sessions >= 1, "--sessions must be at least 1"),
            (1 <= low <= high, "observation token range must satisfy 1 <= low <= high"),
            (self.num_threads >= 0, "--threads must be at least 1 (0: torch's default)"),
        ]
        check_settings(checks)


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    markdown: str


SessionPairs = list[tuple[Session, Session]]


def _sessions(settings: GatewayBenchSettings, engine: ServingEngine) -> tuple[SessionPairs, tuple[Session, Session]]:
    """Per pair the same observations twice, each with its own system-prompt nonce (WebSocket, chat)."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError(f"model {settings.model} has no tokenizer; the gateway needs one")

    def pair(index: int, turns: int, seed: int) -> tuple[Session, Session]:
        args = (tokenizer, turns, settings.observation_tokens, seed)
        return make_session(*args, nonce=f"w{index:03d}"), make_session(*args, nonce=f"c{index:03d}")

    pairs = [pair(i, settings.turns, settings.seed + 1 + i) for i in range(settings.sessions)]
    warm = pair(999, min(WARM_UP_TURNS, settings.turns), settings.seed + 10_000)
    template = load_chat_template(engine.checkpoint)
    longest = max(session_tokens(s, template, tokenizer, settings.max_tokens) for p in pairs for s in p)
    if longest > engine.max_model_len:
        raise ValueError(f"a {settings.turns}-turn session needs about {longest} tokens, more than the model's "
                         f"context of {engine.max_model_len}: use fewer --turns or a model with a longer context")
    return pairs, warm


def _gateway_settings(settings: GatewayBenchSettings) -> GatewaySettings:
    """In-memory sessions, no keys, and admission that never refuses (a refused request has no latency)."""
    base = GatewaySettings(model=settings.model, redis_url=None, auth_enabled=False,
                           default_max_tokens=settings.max_tokens)
    return base.model_copy(update={"limits": base.limits.model_copy(update={"ttft_slo_s": ADMIT_ALL_SLO_S})})


def _measure(settings: GatewayBenchSettings, gw: RunningGateway, pairs: SessionPairs,
             warm: tuple[Session, Session]) -> tuple[dict[str, Any], dict[str, Any]]:
    with ClientProcess(gw.url) as client:
        overhead = measure_overhead(gw, client, settings.requests, settings.concurrency, settings.rounds,
                                    settings.max_tokens, settings.seed)
        runs = run_sessions(client, gw.state.model_name, pairs, warm, settings.max_tokens)
    return overhead, bench_report.summarize_sessions(runs)


def run_benchmark(settings: GatewayBenchSettings, out_dir: Path,
                  engine_settings: EngineSettings | None = None) -> BenchResult:
    settings.validate()
    missing = [name for name in ("openai", "aiohttp") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"the gateway benchmark's client needs {' and '.join(missing)} "
                         "(pip install 'agentserve[dev]')")
    start = time.perf_counter()
    engine_settings = engine_settings or EngineSettings()
    if settings.num_threads:
        engine_settings = engine_settings.model_copy(update={"num_threads": settings.num_threads})
    engine: LLMEngine | WorkerEngine = (LLMEngine(settings.model, engine_settings) if settings.engine_in_process
                                               else colocated_engine(settings.model, engine_settings))
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    try:
        pairs, warm = _sessions(settings, engine)
    except BaseException:  # the gateway, which stops the engine, never started
        engine.shutdown()
        raise
    with running_gateway(_gateway_settings(settings), engine) as gw:
        overhead, session = _measure(settings, gw, pairs, warm)
    load_at_end = os.getloadavg()
    report = {
        "settings": asdict(settings), "engine_settings": engine_settings.model_dump(), "machine": machine,
        "model_config": asdict(engine.config), "overhead": overhead, "session": session,
        "goal": bench_report.goal(overhead),
        "bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(load_at_end),
    }
    tables = [bench_report.overhead_table(overhead), bench_steps.steps_table(overhead["levels"]),
              bench_report.session_summary_table(session), bench_report.per_turn_table(session)]
    title = f"{settings.model}: {settings.turns}-turn agent session, max_output_tokens {settings.max_tokens}, greedy"
    notes = bench_report.notes(overhead, machine["load_average"][0], load_at_end[0], machine["cpu_count"] or 1,
                               settings.engine_in_process)
    files = write_report(out_dir, report, "agentserve gateway benchmark", tables,
                         bench_report.turn_chart(session, title), notes)
    return BenchResult(report, files, files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = GatewayBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint dir")
    parser.add_argument("--requests", type=int, default=defaults.requests,
                        help="chat requests per concurrency level, path and round")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(defaults.concurrency),
                        help="concurrency levels of the overhead runs")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="rounds per concurrency level")
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns of each agent session")
    parser.add_argument("--sessions", type=int, default=defaults.sessions, help="agent sessions per mode")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the engine (0: torch's default)")
    parser.add_argument("--engine-in-process", action="store_true",
                        help="run the engine on a thread of the gateway, as before it became a process")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in INT_OPTIONS}
    settings = GatewayBenchSettings(model=args.model, concurrency=tuple(args.concurrency), num_threads=args.threads,
                                    engine_in_process=args.engine_in_process, **options)
    result = run_benchmark(settings, args.out)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart} "
          f"({result.report['bench_wall_s']:.0f} s in all)")
