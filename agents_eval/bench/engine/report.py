"""The engine benchmark's figures as JSON, markdown tables and a throughput chart."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from agents_eval.bench.engine.engine import PrefixCacheTiming
from agents_eval.bench.engine.workload import BenchRequest, RunResult
from agents_eval.report import BarChart, Table
from engine.core.llm_engine import LLMEngine

GOAL_RATIO = 3.0
ENGINE_KEY, SEQUENTIAL_KEY, BATCHED_KEY = "engine", "hf_sequential", "hf_batched"
THROUGHPUT_HEADERS = ["configuration", "output tok/s", "wall s", "ratio (engine ÷ this)"]
PREFIX_HEADERS = ["prefix cache", "time ms", "cached tokens", "speed-up"]
BUSY_LOAD_PER_CPU = 0.25  # a 1-minute load average above this share of the CPUs: other work is running


@dataclass
class Figures:
    """Everything one benchmark run measured."""

    workload: list[BenchRequest]
    runs: dict[str, RunResult]  # ENGINE_KEY first, then the baselines that ran
    prefix: PrefixCacheTiming
    hf_attn_implementation: str

    def ratio(self, key: str) -> float | None:
        return self.runs[ENGINE_KEY].tokens_per_s / self.runs[key].tokens_per_s if key in self.runs else None


def _ratios(figures: Figures) -> dict[str, Any]:
    sequential = figures.ratio(SEQUENTIAL_KEY)
    return {
        "vs_hf_sequential": sequential,
        "vs_hf_batched": figures.ratio(BATCHED_KEY),
        "goal_vs_hf_sequential": GOAL_RATIO,
        "goal_met": None if sequential is None else sequential >= GOAL_RATIO,
    }


def _runs_json(figures: Figures, engine: LLMEngine) -> dict[str, Any]:
    reference = figures.runs[ENGINE_KEY].tokens
    runs = {key: run.to_json(figures.workload, None if key == ENGINE_KEY else reference)
            for key, run in figures.runs.items()}
    runs[ENGINE_KEY]["num_preemptions"] = engine.scheduler.num_preemptions
    return runs


def report_json(settings: dict[str, Any], machine: dict[str, Any], engine: LLMEngine, figures: Figures,
                end: dict[str, Any]) -> dict[str, Any]:
    """end: figures taken after the run (`bench_wall_s`, `load_average_at_end`)."""
    workload = figures.workload
    return {
        "benchmark": "engine",
        "settings": settings,
        "engine_settings": engine.settings.model_dump(),
        "model_config": engine.config.to_hf_dict(),
        "machine": machine,
        "workload": {"num_requests": len(workload), "input_tokens": sum(len(r.prompt) for r in workload),
                     "output_tokens": sum(r.output_len for r in workload)},
        **_runs_json(figures, engine),
        "hf_attn_implementation": figures.hf_attn_implementation,
        "ratios": _ratios(figures),
        "prefix_cache": figures.prefix.to_json(),
        **end,
    }


def _throughput_row(run: RunResult, engine_rate: float) -> list[str]:
    ratio = engine_rate / run.tokens_per_s
    return [run.label, f"{run.tokens_per_s:.1f}", f"{run.wall_s:.2f}", f"{ratio:.2f}x"]


def tables(figures: Figures) -> list[Table]:
    engine_rate = figures.runs[ENGINE_KEY].tokens_per_s
    throughput = Table("Throughput", THROUGHPUT_HEADERS,
                       [_throughput_row(run, engine_rate) for run in figures.runs.values()])
    prefix = figures.prefix
    title = f"Prefill of a {prefix.prompt_len}-token prompt, max_tokens=1, median of {len(prefix.cold_s)}"
    cold_ms, warm_ms = 1000 * median(prefix.cold_s), 1000 * median(prefix.warm_s)
    cache = Table(title, PREFIX_HEADERS, [
        ["cold", f"{cold_ms:.1f}", str(prefix.cold_cached_tokens), "1.00x"],
        ["warm", f"{warm_ms:.1f}", str(prefix.warm_cached_tokens), f"{prefix.speedup:.2f}x"],
    ])
    return [throughput, cache]


def throughput_chart(title: str, figures: Figures) -> BarChart:
    runs = list(figures.runs.values())
    return BarChart("throughput.png", title, "output tokens / s",
                    [run.label for run in runs], [run.tokens_per_s for run in runs])


def busy_notes(load_at_start: float, load_at_end: float, threads: int, cpu_count: int) -> list[str]:
    """Warnings for report.md when other processes shared the machine (our own run adds `threads`)."""
    slack = BUSY_LOAD_PER_CPU * cpu_count
    notes = []
    if load_at_start > slack:
        notes.append(f"Other work was running before the benchmark (1-minute load average {load_at_start:.2f} "
                     f"on {cpu_count} CPUs): wall times may be inflated.")
    if load_at_end > threads + slack:
        notes.append(f"Other work ran during the benchmark (1-minute load average {load_at_end:.2f} at the end, "
                     f"{threads} of it ours): wall times may be inflated; report.json also has CPU seconds.")
    return notes
