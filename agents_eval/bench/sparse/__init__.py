"""`agentserve bench sparse`: decode step and prefill chunk time with history blocks skipped, against the dense
kernel the engine uses today, at batch 1 and 16 and contexts of 2k, 4k and 6k tokens on SmolLM2-135M.

The goal: at batch 16 and a 6k context with half the history blocks skipped, a decode step at least 1.5x
faster than dense. The `query` policy's refresh step (block summaries and scores) is timed too, and its cost
spread over `refresh_steps` decode steps. Writes `report.json`, `report.md` and `speedup.png` to --out.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agents_eval.bench.sparse import report as sparse_report
from agents_eval.bench.sparse.measure import Case, fill_kv, interleaved_medians, make_batch, skipped_blocks, spans_for
from agents_eval.report import machine_info
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.model.mask import QuerySelection, spans_skipping_blocks

__all__ = ["SparseBenchSettings", "add_arguments", "run", "run_benchmark"]

ONE_BLOCK = "skip_one_block"  # the gathered path over nearly all the history: the gather's own effect


@dataclass(frozen=True)
class SparseBenchSettings:
    model: str = "smollm2"
    contexts: tuple[int, ...] = (2048, 4096, 6144)
    batches: tuple[int, ...] = (1, 16)
    skipped: tuple[float, ...] = (0.0, 0.5, 0.75)
    decode_repeats: int = 7
    prefill_tokens: int = 16  # new tokens prefilled after the history (prefill time is per chunk)
    prefill_repeats: int = 2
    refresh_steps: int = 16  # the query policy's decode steps between selections
    num_threads: int = 1  # two threads on a core shared with other work stall on each other (docs/sparse_history.md)
    seed: int = 0

    @classmethod
    def quick(cls, model: str = "tiny") -> SparseBenchSettings:
        return cls(model=model, contexts=(512, 1024), batches=(1, 4), decode_repeats=3, prefill_tokens=32,
                   prefill_repeats=2)


def _runner_of(settings: SparseBenchSettings) -> LLMEngine:
    block_size = 16
    per_stream = -(-(max(settings.contexts) + settings.prefill_tokens) // block_size)
    engine_settings = EngineSettings(block_size=block_size, num_kv_blocks=max(settings.batches) * per_stream,
                                     num_threads=settings.num_threads, enable_prefix_caching=False)
    engine = LLMEngine(settings.model, engine_settings)
    fill_kv(engine.runner, settings.seed)
    return engine


def _measure_case(engine: LLMEngine, settings: SparseBenchSettings, case: Case) -> dict[str, Any]:
    runner, size = engine.runner, engine.settings.block_size
    per_stream = engine.num_blocks // max(settings.batches)
    steps = {f"skip_{share:g}": make_batch(case, size, per_stream, spans_for(case, size, share, settings.seed))
             for share in settings.skipped}
    steps[ONE_BLOCK] = make_batch(case, size, per_stream, spans_skipping_blocks([1], size, case.context))
    if case.new_tokens == 1:
        selection = QuerySelection(budget=0.5, refresh_steps=settings.refresh_steps)
        steps["query_refresh"] = make_batch(case, size, per_stream, [], selection)
    repeats = settings.decode_repeats if case.new_tokens == 1 else settings.prefill_repeats
    timings = interleaved_medians(runner, steps, repeats)
    if "query_refresh" in steps:
        for seq in steps["query_refresh"][0].seqs:
            runner.release(seq.request_id)
    shares = {f"skip_{share:g}": len(skipped_blocks(case.context, size, share, settings.seed)) / (case.context // size)
              for share in settings.skipped}
    return {"batch": case.batch, "context": case.context, "new_tokens": case.new_tokens, "timings": timings,
            "skipped_share": shares}


def run_benchmark(settings: SparseBenchSettings, out_dir: Path) -> dict[str, Any]:
    start = time.perf_counter()
    torch.set_num_threads(settings.num_threads)
    machine = machine_info()
    engine = _runner_of(settings)
    cases = [Case(batch, context, new) for new in (1, settings.prefill_tokens)
             for batch in settings.batches for context in settings.contexts]
    results = [_measure_case(engine, settings, case) for case in cases]
    report = {"settings": asdict(settings), "model": str(engine.checkpoint or settings.model), "machine": machine,
              "cases": [sparse_report.with_speedups(r, settings.refresh_steps) for r in results],
              "bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(os.getloadavg())}
    report["goals"] = sparse_report.goals(report)
    sparse_report.write(out_dir, report)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SparseBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=None, help=f"built-in model name or checkpoint (default {defaults.model}"
                                                       ", or tiny with --quick)")
    parser.add_argument("--quick", action="store_true", help="small contexts and batches, few repeats (tests)")
    parser.add_argument("--repeats", type=int, default=defaults.decode_repeats, help="decode steps timed per variant")
    parser.add_argument("--threads", type=int, default=defaults.num_threads, help="torch threads")


def run(args: argparse.Namespace) -> None:
    if args.quick:
        settings = SparseBenchSettings.quick(args.model or "tiny")
    else:
        settings = SparseBenchSettings(model=args.model or SparseBenchSettings.model, decode_repeats=args.repeats)
    settings = SparseBenchSettings(**{**asdict(settings), "num_threads": args.threads})
    run_benchmark(settings, args.out)
    print((args.out / "report.md").read_text())
