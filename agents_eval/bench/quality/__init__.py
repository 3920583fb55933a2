"""`agentserve bench quality`: what pruning and sparse history masks cost in answers, on a real model.

Seeded agent transcripts (shell listings, logs, accessibility trees, JSON results as `tool` messages) end in
a question one observation answers. Each runs, greedy, under nine variants of history handling (full, pruned,
the `age`, `query` and `attention` history policies each with and without pruning, dropped); the report gives
per variant the observation tokens whose attention is saved, the answers kept (by how old the observation asked
about is), and how often the continuation stays the same as full's. See docs/quality.md.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from agents_eval.bench.quality import report as quality_report
from agents_eval.bench.quality.bench import Measured, QualityBenchSettings, measure
from agents_eval.bench.quality.variants import PLACEHOLDER
from agents_eval.harness.report import machine_info
from engine.config import EngineSettings

__all__ = ["QualityBenchSettings", "QualityResult", "add_arguments", "run", "run_benchmark"]


@dataclass
class QualityResult:
    report: dict[str, Any]
    files: quality_report.ReportFiles
    markdown: str


def _head(settings: QualityBenchSettings, measured: Measured, machine: dict[str, Any]) -> dict[str, Any]:
    engine, masks = measured.engine, measured.policies.settings.masks
    return {"settings": asdict(settings) | {"num_threads": settings.threads},
            "model": {"name": settings.model, "checkpoint": None if engine.checkpoint is None
                      else str(engine.checkpoint), "config": engine.config.to_hf_dict()},
            "engine_settings": engine.settings.model_dump(),
            "policies": {"keep_last_tool_observations": masks.keep_last_tool_observations,
                         "sink_tokens": masks.sink_tokens, "dropped_placeholder": PLACEHOLDER},
            "machine": machine}


def run_benchmark(settings: QualityBenchSettings, out_dir: Path, engine_settings: EngineSettings | None = None,
                  progress: Progress | None = None) -> QualityResult:
    """Every transcript under every variant, then the report files (rewritten after every engine batch with the
    transcripts finished so far, `partial: true`). engine_settings' num_threads is overridden."""
    settings.validate()
    start = time.perf_counter()
    machine = machine_info()  # before the run, so its load average shows other work, not ours

    def write(measured: Measured, partial: bool) -> QualityResult:
        end = {"bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(os.getloadavg()),
               "partial": partial}
        report = quality_report.report_json(measured.results, _head(settings, measured, machine), end)
        files = quality_report.write(out_dir, report)
        return QualityResult(report, files, files.markdown.read_text())

    measured = measure(settings, engine_settings or EngineSettings(), progress or Progress(disable=True),
                       on_batch=lambda so_far: None if not so_far.results else write(so_far, partial=True))
    return write(measured, partial=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = QualityBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint")
    parser.add_argument("--transcripts", type=int, default=defaults.transcripts, help="how many transcripts")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the transcript generator")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens per answer (greedy)")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="transcripts per engine batch")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--variants", nargs="+", default=list(defaults.variants),
                        help="the variants to run (full always runs: the reference)")
    parser.add_argument("--indices", nargs="+", type=int, default=[],
                        help="only these of the seed's transcripts (default: the first --transcripts)")
    parser.add_argument("--every-variant", action="store_true",
                        help="run every variant on every transcript (default: only on those full answers)")


def run(args: argparse.Namespace) -> None:
    settings = QualityBenchSettings(model=args.model, transcripts=args.transcripts, seed=args.seed,
                                    max_tokens=args.max_tokens, batch=args.batch, num_threads=args.threads,
                                    screen=not args.every_variant, variants=tuple(args.variants),
                                    indices=tuple(args.indices))
    with Progress() as progress:
        result = run_benchmark(settings, args.out, progress=progress)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart} ({result.report['bench_wall_s']:.0f} s in all)")
