"""`agentserve bench batcher`: the SLO queue policy (VIP first, TTFT deadlines, fewest remaining steps,
least attained service per agent session) against FCFS on one engine and one mixed workload.

Long-context agent sessions (one of them VIP) and short chat requests are replayed on `LLMEngine` directly,
arrivals counted in engine steps, once per policy. The report gives p50/p99 TTFT and TPOT per request kind,
in wall seconds and in steps, the SLO/FCFS ratios and the spread of agent sessions' mean TTFT: `report.json`,
`report.md` and `ttft_p99.png` in the output folder.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agents_eval.bench.batcher import report as batcher_report
from agents_eval.bench.batcher.drive import Driver
from agents_eval.bench.batcher.workload import SLO_CLASSES, BatcherBenchSettings, BatcherWorkload, build_workload
from agents_eval.harness.report import machine_info
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.queue_policy import PolicyName
from engine.core.sampling.sampler import SamplingParams
from engine.core.slo import SloConfig, load_slo_config

__all__ = ["BatcherBenchSettings", "add_arguments", "run", "run_benchmark"]

POLICIES: tuple[PolicyName, ...] = ("fcfs", "slo")  # report.POLICIES, typed for the engine settings


def scaled_slo(config: SloConfig, scale: float) -> SloConfig:
    """Every class's targets, and the fairness half-life, times scale."""
    classes = {name: c.model_copy(update={"ttft_s": c.ttft_s * scale, "tpot_s": c.tpot_s * scale})
               for name, c in config.classes.items()}
    fairness = config.fairness.model_copy(update={"half_life_s": config.fairness.half_life_s * scale})
    return config.model_copy(update={"classes": classes, "fairness": fairness})


def _engine(settings: BatcherBenchSettings, policy: PolicyName) -> LLMEngine:
    engine_settings = EngineSettings(max_num_seqs=settings.max_num_seqs, queue_policy=policy,
                                     max_num_batched_tokens=settings.max_num_batched_tokens,
                                     num_threads=settings.num_threads)
    engine = LLMEngine(settings.model, engine_settings, scaled_slo(load_slo_config(), settings.slo_scale))
    engine.generate([[5] * 32], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    return engine


def _run_policy(settings: BatcherBenchSettings, policy: PolicyName, workload: BatcherWorkload) -> dict[str, Any]:
    engine = _engine(settings, policy)
    start = time.perf_counter()
    driver = Driver(engine, workload)
    timings = driver.run()
    targets = {kind: engine.slo.slo_class(name) for kind, name in SLO_CLASSES.items()}
    return batcher_report.policy_json(timings, targets, time.perf_counter() - start, driver.step,
                                      engine.scheduler.num_preemptions)


def run_benchmark(settings: BatcherBenchSettings, out_dir: Path) -> dict[str, Any]:
    settings.validate()
    start = time.perf_counter()
    torch.set_num_threads(settings.num_threads)
    machine = machine_info()  # before the run, so its load average shows other work, not ours
    probe = _engine(settings, "fcfs")
    workload = build_workload(settings, probe.config.vocab_size, probe.max_model_len)
    policies: dict[str, Any] = {policy: _run_policy(settings, policy, workload) for policy in POLICIES}
    report = {"settings": asdict(settings), "engine_settings": probe.settings.model_dump(),
              "slo_classes": probe.slo.model_dump(), "machine": machine, "num_requests": workload.num_requests,
              "policies": policies, "ratios": batcher_report.ratios(policies),
              "goals": [],  # a comparison of the two policies; no goal is stated for it (docs/engine.md)
              "bench_wall_s": time.perf_counter() - start, "load_average_at_end": list(os.getloadavg())}
    batcher_report.write(out_dir, report)
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BatcherBenchSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model, help="built-in model name or checkpoint")
    parser.add_argument("--chat-requests", type=int, default=defaults.chat_requests, help="short chat requests")
    parser.add_argument("--chat-gap", type=float, default=defaults.chat_gap_steps,
                        help="mean engine steps between chat arrivals")
    parser.add_argument("--sessions", type=int, default=defaults.sessions, help="agent sessions (the first is VIP)")
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns per agent session")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs, help="engine sequence slots")
    parser.add_argument("--budget", type=int, default=defaults.max_num_batched_tokens,
                        help="engine tokens per step (max_num_batched_tokens)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="workload seed")
    parser.add_argument("--slo-scale", type=float, default=defaults.slo_scale,
                        help="multiply the TTFT/TPOT targets of configs/slo.yaml by this")
    parser.add_argument("--threads", type=int, default=defaults.num_threads, help="torch threads")


def run(args: argparse.Namespace) -> None:
    settings = BatcherBenchSettings(model=args.model, chat_requests=args.chat_requests, chat_gap_steps=args.chat_gap,
                                    sessions=args.sessions, turns=args.turns, max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=args.budget, seed=args.seed, num_threads=args.threads,
                                    slo_scale=args.slo_scale)
    run_benchmark(settings, args.out)
    print((args.out / "report.md").read_text())
