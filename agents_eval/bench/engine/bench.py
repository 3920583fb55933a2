"""`agentserve bench engine`: our colocated engine against `transformers`' generate on the same weights.

A seeded workload of random prompts, every request generating exactly its output length greedily, runs
through our engine (all requests submitted at once), through `generate` one request at a time, and
through left-padded batched `generate`. A second phase times one long prompt's prefill with a cold and
a warm prefix cache. Results go to `report.json`, `report.md` and `throughput.png` in the output folder.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from agents_eval.bench.engine import engine as ours
from agents_eval.bench.engine import report as bench_report
from agents_eval.bench.engine.engine import Advance, PrefixCacheTiming
from agents_eval.bench.engine.report import BATCHED_KEY, ENGINE_KEY, SEQUENTIAL_KEY, Figures
from agents_eval.bench.engine.workload import (
    BenchRequest,
    LengthRange,
    RunResult,
    make_workload,
    random_prompt,
)
from agents_eval.report import ReportFiles, check_settings, machine_info, write_report
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine

INT_OPTIONS = ("num_requests", "min_input", "max_input", "min_output", "max_output", "seed", "hf_batch_size")


@dataclass(frozen=True)
class BenchSettings:
    model: str = "small"
    num_requests: int = 64
    min_input: int = 128
    max_input: int = 512
    min_output: int = 64
    max_output: int = 128
    seed: int = 0
    hf_sequential: bool = True
    hf_batch_size: int = 16
    prefix_prompt_len: int = 512
    prefix_repeats: int = 5
    num_threads: int = 0  # 0: every core

    def validate(self) -> None:
        checks = [
            (self.num_requests >= 1, "--num-requests must be at least 1"),
            (2 <= self.min_input <= self.max_input, "need 2 <= --min-input <= --max-input"),
            (1 <= self.min_output <= self.max_output, "need 1 <= --min-output <= --max-output"),
            (self.hf_batch_size >= 1, "--hf-batch-size must be at least 1"),
            (self.prefix_prompt_len >= 2, "the prefix-cache prompt needs at least 2 tokens"),
            (self.prefix_repeats >= 1, "prefix-cache timing needs at least 1 repeat"),
            (self.num_threads >= 0, "--threads must be at least 1 (0: every core)"),
        ]
        check_settings(checks)

    @property
    def threads(self) -> int:
        return self.num_threads or os.cpu_count() or 1


@dataclass
class BenchResult:
    report: dict[str, Any]
    figures: Figures
    files: ReportFiles
    markdown: str


def _phase(progress: Progress, description: str, total: int) -> Advance:
    task = progress.add_task(description, total=total)
    return lambda n: progress.advance(task, n)


def _bos(engine: LLMEngine) -> int:
    return engine.config.bos_token_id if engine.config.bos_token_id is not None else 1


def _check_fits(settings: BenchSettings, engine: LLMEngine) -> None:
    longest = max(settings.max_input + settings.max_output, settings.prefix_prompt_len + 1)
    if longest > engine.max_model_len:
        raise ValueError(f"requests of up to {longest} tokens exceed the model's context of "
                         f"{engine.max_model_len} tokens")


def _workload(settings: BenchSettings, engine: LLMEngine) -> list[BenchRequest]:
    inputs = LengthRange(settings.min_input, settings.max_input)
    outputs = LengthRange(settings.min_output, settings.max_output)
    return make_workload(settings.num_requests, inputs, outputs, engine.config.vocab_size, _bos(engine),
                         settings.seed)


def _run_engine(engine: LLMEngine, workload: list[BenchRequest], progress: Progress) -> RunResult:
    ours.warm_up(engine, [r.prompt for r in workload[:2]])
    return ours.run_engine(engine, workload, _phase(progress, "agentserve engine", len(workload)))


def _hf_baselines(settings: BenchSettings, engine: LLMEngine, workload: list[BenchRequest],
                  progress: Progress) -> tuple[dict[str, RunResult], str]:
    try:
        from agents_eval.bench.engine import hf as hf
    except ImportError as err:
        raise ValueError(f"the baseline needs transformers (pip install 'agentserve[dev]'): {err}") from None
    hf_model = hf.build_hf_model(engine.runner.model, engine.config)
    hf.warm_up(hf_model, [r.prompt for r in workload[:2]], ours.WARMUP_PROMPT_LEN, ours.WARMUP_OUTPUT_LEN)
    runs = {}
    if settings.hf_sequential:
        advance = _phase(progress, "HF generate, batch 1", len(workload))
        runs[SEQUENTIAL_KEY] = hf.run_sequential(hf_model, workload, advance)
    advance = _phase(progress, f"HF generate, batches of {settings.hf_batch_size}", len(workload))
    runs[BATCHED_KEY] = hf.run_batched(hf_model, workload, settings.hf_batch_size, advance)
    return runs, hf.attention_implementation(hf_model)


def _time_prefix_cache(settings: BenchSettings, engine: LLMEngine, progress: Progress) -> PrefixCacheTiming:
    rng = random.Random(settings.seed + 1)
    prompt = random_prompt(rng, settings.prefix_prompt_len, engine.config.vocab_size, _bos(engine))
    advance = _phase(progress, "prefix cache, cold then warm", 2 * settings.prefix_repeats)
    return ours.time_prefix_cache(engine, prompt, settings.prefix_repeats, advance)


def _chart_title(settings: BenchSettings) -> str:
    return f"{settings.model}: {settings.num_requests} requests, greedy, {settings.threads} torch threads"


def run_benchmark(settings: BenchSettings, out_dir: Path, engine_settings: EngineSettings | None = None,
                  progress: Progress | None = None) -> BenchResult:
    """Every phase, then the report files. engine_settings' num_threads is overridden by settings'."""
    settings.validate()
    progress = progress or Progress(disable=True)
    start = time.perf_counter()
    torch.set_num_threads(settings.threads)
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    threads = {"num_threads": settings.threads}
    engine = LLMEngine(settings.model, (engine_settings or EngineSettings()).model_copy(update=threads))
    _check_fits(settings, engine)
    workload = _workload(settings, engine)
    runs = {ENGINE_KEY: _run_engine(engine, workload, progress)}
    hf_runs, attn_implementation = _hf_baselines(settings, engine, workload, progress)
    figures = Figures(workload, runs | hf_runs, _time_prefix_cache(settings, engine, progress),
                      attn_implementation)
    settings_json = asdict(settings) | {"num_threads": settings.threads}
    load_at_end = os.getloadavg()
    end = {"bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(load_at_end)}
    report = bench_report.report_json(settings_json, machine, engine, figures, end)
    notes = bench_report.busy_notes(machine["load_average"][0], load_at_end[0], settings.threads,
                                    machine["cpu_count"] or 1)
    files = write_report(out_dir, report, "agentserve engine benchmark", bench_report.tables(figures),
                         bench_report.throughput_chart(_chart_title(settings), figures), notes)
    return BenchResult(report, figures, files, files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint dir")
    for name in INT_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--threads", type=int, default=0, help="torch threads for every run (0: all cores)")
    parser.add_argument("--skip-hf-sequential", action="store_true", help="skip the slow batch-1 baseline")


def run(args: argparse.Namespace) -> None:
    options = {name: getattr(args, name) for name in INT_OPTIONS}
    settings = BenchSettings(model=args.model, hf_sequential=not args.skip_hf_sequential,
                             num_threads=args.threads, **options)
    with Progress() as progress:
        result = run_benchmark(settings, args.out, progress=progress)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart} "
          f"({result.report['bench_wall_s']:.0f} s in all)")
