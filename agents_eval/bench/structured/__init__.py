"""`agentserve bench structured`: structured outputs and forced tool calls on a real model (SmolLM2 by default).

Validity of `tool_choice="required"` replies on seeded agent tasks (1-4 tools each) and of json_schema replies on
pydantic-style schemas, each against the unconstrained replies to the same prompts and seeds; the masks' cost at
batch 1 and 16; jump-forward's speed-up on tool-call outputs. See `bench.py` for how each figure is measured."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents_eval.bench.structured import report as structured_report
from agents_eval.bench.structured.bench import StructuredBenchSettings, measure
from agents_eval.harness.report import machine_info

__all__ = ["StructuredBenchSettings", "add_arguments", "run", "run_benchmark"]


def run_benchmark(settings: StructuredBenchSettings, out_dir: Path) -> dict[str, Any]:
    settings.validate()
    started = time.perf_counter()
    machine = machine_info()  # before the run: its load average shows other work on the machine
    figures = measure(settings)
    data = {"settings": asdict(settings) | {"num_threads": settings.threads}, "machine": machine,
            "figures": figures, "goals": structured_report.goals(figures),
            "bench_wall_s": time.perf_counter() - started, "load_average_at_end": list(os.getloadavg())}
    notes = [f"{settings.model}: {settings.tasks} agent tasks, {settings.schemas} schemas, "
             f"{settings.cost_requests} timed requests, {settings.threads} threads; "
             f"load average {machine['load_average'][0]:.1f} at the start (timings share the machine)."]
    structured_report.write(out_dir, data, notes)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = StructuredBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint")
    parser.add_argument("--tasks", type=int, default=defaults.tasks, help="agent tasks (tool_choice required)")
    parser.add_argument("--schemas", type=int, default=defaults.schemas, help="json_schema tasks")
    parser.add_argument("--cost-requests", type=int, default=defaults.cost_requests,
                        help="tool-call requests timed at batch 16 (the first 4 at batch 1)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens, help="tokens per reply at most")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the tasks and the sampling")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")


def run(args: argparse.Namespace) -> None:
    settings = StructuredBenchSettings(args.model, args.tasks, args.schemas, args.cost_requests, args.max_tokens,
                                       args.seed, args.threads)
    data = run_benchmark(settings, args.out)
    print((args.out / "report.md").read_text())
    print(f"report: {args.out / 'report.json'} ({data['bench_wall_s']:.0f} s in all)")
