"""Run the replay per policy and cache size, then write the report."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from agents_eval.bench.kv_cache import report as kv_report
from agents_eval.bench.kv_cache.engine_replay import multi_turn, replay_on_engine
from agents_eval.bench.kv_cache.replay import replay, unbounded
from agents_eval.bench.kv_cache.settings import KVCacheBenchSettings
from agents_eval.bench.kv_cache.tuning import halves, policy_for, tune_decay
from agents_eval.harness.report import machine_info
from engine.config import EngineSettings
from predictor.traces import TraceRequest, load_trace


def run_benchmark(settings: KVCacheBenchSettings, out_dir: Path) -> dict[str, Any]:
    settings.validate()
    started = time.perf_counter()
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    requests = load_trace(settings.trace, settings.max_requests)
    tune, held_out = halves(requests)
    shipped = EngineSettings().kv_cache.weights  # the LFU shares of configs/engine.yaml
    decay, tuning = tune_decay(tune, shipped, settings.tune_decays_s, settings.sizes)
    weights = replace(shipped, decay_s=decay)
    hit_ratio = {policy: {size: replay(held_out, policy_for(policy, weights, size), size).ratio
                          for size in settings.sizes} for policy in settings.policies}
    report: dict[str, Any] = {
        "settings": asdict(settings) | {"trace": str(settings.trace)}, "lfu_weights": asdict(weights),
        "split": _split(tune, held_out), "tuning": {"decay_s": decay, "hit_ratio_first_half": tuning},
        "requests": len(held_out), "distinct_blocks": len({key for r in held_out for key in r.hash_ids}),
        "hit_ratio": hit_ratio, "bound": unbounded(held_out).ratio, "machine": machine}
    report["goals"] = kv_report.goals(report, settings)
    report["goal_details"] = kv_report.goal_details(report, settings)
    if settings.engine_requests:
        report["engine_replay"] = replay_on_engine(multi_turn(requests, settings.engine_requests),
                                                   settings.engine_device_blocks, settings.engine_host_blocks)
    report["bench_wall_s"] = time.perf_counter() - started
    kv_report.write(out_dir, report, settings)
    return report


def _split(tune: list[TraceRequest], held_out: list[TraceRequest]) -> dict[str, Any]:
    return {"tuned_on": f"requests 0-{len(tune) - 1} (first half)",
            "reported_on": f"requests {len(tune)}-{len(tune) + len(held_out) - 1} (second half, from an empty cache)",
            "tuned_on_ms": [tune[0].timestamp_ms, tune[-1].timestamp_ms] if tune else [],
            "reported_on_ms": [held_out[0].timestamp_ms, held_out[-1].timestamp_ms] if held_out else []}


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = KVCacheBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--trace", type=Path, default=defaults.trace, help="a Mooncake-format trace (JSONL)")
    parser.add_argument("--max-requests", type=int, default=defaults.max_requests,
                        help="replay only the trace's first N requests")
    parser.add_argument("--cache-blocks", type=_sizes, default=defaults.cache_blocks,
                        help="comma-separated cache sizes, in the trace's blocks")
    parser.add_argument("--configured-blocks", type=int, default=defaults.configured_blocks,
                        help="the size the bound goal is checked at")
    parser.add_argument("--engine-requests", type=int, default=defaults.engine_requests,
                        help="also replay the trace's first multi-turn sessions (about N requests) on the tiny "
                             "engine with host and disk tiers (load-vs-recompute decisions); 0: skip")


def run(args: argparse.Namespace) -> None:
    settings = KVCacheBenchSettings(trace=args.trace, max_requests=args.max_requests, cache_blocks=args.cache_blocks,
                                    configured_blocks=args.configured_blocks, engine_requests=args.engine_requests)
    run_benchmark(settings, args.out)
    print((args.out / kv_report.MARKDOWN).read_text())
