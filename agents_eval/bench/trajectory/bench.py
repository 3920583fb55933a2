"""`agentserve bench trajectory`: what agent trajectories save the engine, in tokens and bytes.

1. Synthetic SWE-agent-like sessions through `Trajectory` and the real engine: prefill tokens with turn-delta
   reuse (prefix caching and session pins) against the same recorded requests without a session, once with
   prefix caching off (full recompute) and once with it on (prefix caching only), so the pins are credited
   only with what they save over prefix caching.
2. The Mooncake conversation trace, scaled down, with prefix caching on and off.
3. Tokens removed by pruning per tool-observation type.
4. KV bytes held per session: one growing KV against a full snapshot per turn.
5. Think/act phase-shift detection delay on scripted swings, on a simulated clock.

Everything is seeded. Results go to `report.json`, `report.md`, `prefill_per_turn.png` and
`prefill_totals.png` in the output folder.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from agents_eval.bench.trajectory import report as bench_report
from agents_eval.bench.trajectory import trace as trace
from agents_eval.bench.trajectory.phase import PhaseFigures, PhaseScript, run_phase_swings
from agents_eval.bench.trajectory.report import CACHE_OFF, CACHE_ON, Figures, TraceFigures
from agents_eval.bench.trajectory.sessions import (
    Advance,
    SessionRun,
    SessionWorkload,
    replay_recorded,
    run_sessions,
)
from agents_eval.bench.trajectory.synthetic_outputs import KINDS, PruningFigure, measure_pruning
from agents_eval.harness.report import ReportFiles, check_settings, machine_info, write_report
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.kv_cache.pins import PinStats
from engine.model.tokenizer import Tokenizer
from predictor.traces import DEFAULT_TRACE, load_trace
from trajectory.agent import Policies
from trajectory.template.default import load_chat_template

INT_OPTIONS = ("sessions", "turns", "context_tokens", "max_requests", "seed", "concurrency", "pruning_samples",
               "pruning_tokens", "phase_sessions")


@dataclass(frozen=True)
class TrajectoryBenchSettings:
    model: str = "tiny"
    sessions: int = 8
    turns: int = 20
    context_tokens: int = 2048  # each synthetic session's history, at most (and at most the model's context)
    trace: Path = DEFAULT_TRACE
    max_requests: int = 200
    length_scale: float = 1 / 16
    concurrency: int = 16  # trace requests in flight
    pruning_samples: int = 50  # observations per type
    pruning_tokens: int = 300  # size of each, before pruning
    phase_sessions: int = 64
    phase_segment_s: float = 30.0
    seed: int = 0
    num_threads: int = 0  # 0: every core

    def validate(self) -> None:
        checks = [
            (self.sessions >= 1 and self.turns >= 1, "--sessions and --turns must be at least 1"),
            (self.context_tokens >= 256, "--context-tokens must be at least 256"),
            (self.max_requests >= 1 and self.concurrency >= 1, "--max-requests and --concurrency must be at least 1"),
            (0 < self.length_scale <= 1, "--length-scale must be in (0, 1]"),
            (self.pruning_samples >= 1 and self.pruning_tokens >= 1, "pruning needs at least 1 sample of 1 token"),
            (self.phase_sessions >= 1 and self.phase_segment_s > 0, "the phase script needs sessions and time"),
            (self.num_threads >= 0, "--threads must be at least 1 (0: every core)"),
            (self.trace.is_file(), f"trace not found: {self.trace} (pass --trace)"),
        ]
        check_settings(checks)

    @property
    def threads(self) -> int:
        return self.num_threads or os.cpu_count() or 1


@dataclass(frozen=True)
class EngineFacts:
    """What the report needs of the synthetic-session engine, so the engine itself can go."""

    engine_settings: dict[str, Any]
    model_config: dict[str, Any]
    kv_bytes_per_token: int  # 2 * layers * kv_heads * head_dim * dtype bytes
    tokenizer: Tokenizer

    @classmethod
    def of(cls, engine: LLMEngine) -> EngineFacts:
        config, dtype = engine.config, getattr(torch, engine.settings.dtype)
        per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype.itemsize
        return cls(engine.settings.model_dump(), config.to_hf_dict(), per_token, _tokenizer(engine))


@dataclass
class BenchResult:
    report: dict[str, Any]
    figures: Figures
    files: ReportFiles
    per_turn_chart: Path
    markdown: str


class _Run:
    """One benchmark run: its settings, the engine settings every engine starts from, and the progress."""

    def __init__(self, settings: TrajectoryBenchSettings, engine_settings: EngineSettings, progress: Progress):
        self.settings = settings
        self.engine_settings = engine_settings
        self.progress = progress

    def phase(self, description: str, total: int) -> Advance:
        task = self.progress.add_task(description, total=total)
        return lambda n: self.progress.advance(task, n)

    def engine(self, prefix_caching: bool) -> LLMEngine:
        update = {"num_threads": self.settings.threads, "enable_prefix_caching": prefix_caching}
        return LLMEngine(self.settings.model, self.engine_settings.model_copy(update=update))

    def synthetic(self) -> tuple[list[SessionRun], PinStats, EngineFacts]:
        engine = self.engine(prefix_caching=True)
        workload = SessionWorkload(self.settings.sessions, self.settings.turns, self.settings.seed,
                                   load_chat_template(engine.checkpoint), _tokenizer(engine),
                                   Policies.load(), self.settings.context_tokens)
        advance = self.phase("synthetic sessions, turn-delta reuse", workload.sessions * workload.turns)
        return run_sessions(engine, workload, advance), engine.scheduler.pins.stats, EngineFacts.of(engine)

    def replay(self, runs: list[SessionRun], prefix_caching: bool) -> list[int]:
        """The recorded requests without a session pin; prefill tokens computed per turn index."""
        caching = "prefix caching" if prefix_caching else "no cache"
        advance = self.phase(f"synthetic sessions, {caching}, no pin", sum(len(r.requests) for r in runs))
        return replay_recorded(self.engine(prefix_caching), runs, advance)

    def trace_replay(self) -> TraceFigures:
        settings = self.settings
        requests = load_trace(settings.trace, settings.max_requests)
        runs: dict[str, trace.ReplayCounts] = {}
        scaled: list[trace.ScaledRequest] = []
        for key, caching in ((CACHE_OFF, False), (CACHE_ON, True)):
            engine = self.engine(caching)
            scaled = scaled or trace.scale_requests(requests, settings.length_scale, engine.max_model_len,
                                                    engine.config.vocab_size, settings.seed)
            advance = self.phase(f"trace replay, {key.replace('_', ' ')}", len(scaled))
            runs[key] = trace.replay(engine, scaled, settings.concurrency, advance)
        return TraceFigures(scaled, trace.block_length(settings.length_scale), runs)

    def pruning(self, tokenizer: Tokenizer, policies: Policies) -> dict[str, PruningFigure]:
        advance = self.phase("pruning per observation type", len(KINDS))
        figures: dict[str, PruningFigure] = {}
        for kind in KINDS:
            figures[kind] = measure_pruning(kind, self.settings.pruning_samples, self.settings.pruning_tokens,
                                            policies.pruning, lambda text: len(tokenizer.encode(text)),
                                            self.settings.seed)
            advance(1)
        return figures

    def phase_swings(self, policies: Policies) -> PhaseFigures:
        script = PhaseScript(self.settings.phase_sessions, self.settings.phase_segment_s)
        advance = self.phase("phase swings", len(script.think_shares))
        return run_phase_swings(script, policies.phase, self.settings.seed, advance)


def _tokenizer(engine: LLMEngine) -> Tokenizer:
    if engine.tokenizer is None:
        raise ValueError("the trajectory benchmark renders chat messages and needs a model with a tokenizer")
    return engine.tokenizer


def _measure(bench: _Run) -> tuple[Figures, EngineFacts]:
    runs, pins, facts = bench.synthetic()
    replays = {CACHE_OFF: bench.replay(runs, prefix_caching=False), CACHE_ON: bench.replay(runs, prefix_caching=True)}
    trace_figures = bench.trace_replay()
    policies = Policies.load()
    figures = Figures(runs, replays, pins, facts.kv_bytes_per_token, trace_figures,
                      bench.pruning(facts.tokenizer, policies), bench.phase_swings(policies))
    return figures, facts


def run_benchmark(settings: TrajectoryBenchSettings, out_dir: Path, engine_settings: EngineSettings | None = None,
                  progress: Progress | None = None) -> BenchResult:
    """Every part, then the report files. engine_settings' num_threads and prefix caching are overridden."""
    settings.validate()
    start = time.perf_counter()
    torch.set_num_threads(settings.threads)
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    bench = _Run(settings, engine_settings or EngineSettings(), progress or Progress(disable=True))
    figures, facts = _measure(bench)
    head = {"settings": asdict(settings) | {"trace": str(settings.trace), "num_threads": settings.threads},
            "engine_settings": facts.engine_settings, "model_config": facts.model_config, "machine": machine}
    end = {"bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(os.getloadavg())}
    report = bench_report.report_json(figures, head, end)
    files = write_report(out_dir, report, "agentserve trajectory benchmark", bench_report.tables(report),
                         bench_report.totals_chart(report), bench_report.notes(report))
    per_turn_chart = out_dir / bench_report.PER_TURN_CHART
    bench_report.save_per_turn_chart(figures, per_turn_chart)
    return BenchResult(report, figures, files, per_turn_chart, files.markdown.read_text())


def _fraction(text: str) -> float:
    """A float, or a fraction such as 1/16."""
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a number or fraction: {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrajectoryBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint dir")
    for name in INT_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--trace", type=Path, default=defaults.trace, help="Mooncake trace (JSON lines)")
    parser.add_argument("--length-scale", type=_fraction, default=defaults.length_scale,
                        help="trace lengths are multiplied by this, e.g. 1/16")
    parser.add_argument("--phase-segment-s", type=float, default=defaults.phase_segment_s,
                        help="simulated seconds per think/act regime")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in INT_OPTIONS}
    settings = TrajectoryBenchSettings(model=args.model, trace=args.trace, length_scale=args.length_scale,
                                       phase_segment_s=args.phase_segment_s, num_threads=args.threads, **options)
    with Progress() as progress:
        result = run_benchmark(settings, args.out, progress=progress)
    print(result.markdown)
    print(f"report: {result.files.json}, charts: {result.per_turn_chart}, {result.files.chart} "
          f"({result.report['bench_wall_s']:.0f} s in all)")
