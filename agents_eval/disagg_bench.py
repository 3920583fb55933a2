"""Prefill/decode interference: ongoing decodes while long prefills keep arriving, on one colocated engine
(both cores) against one prefill + one decode worker process (one core each), in one run. Reports p50/p99
time per output token of the decode streams, the share of KV sending hidden behind prefill compute, and
role-switch latency.

    agentserve bench disagg --out DIR [--model small] [--decodes 8] [--prefills 12] [--prefill-every 0.5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from rich.console import Console

from agents_eval.report import BarChart, Table, machine_info, write_report
from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.llm_engine import LLMEngine
from engine.output import RequestOutput
from engine.sampling import SamplingParams
from engine.worker.coordinator import DisaggregatedEngine
from engine.worker.deployment import DeploymentSettings

# The interference measurement wants every request to cross the wire on a fixed split.
FIXED_SPLIT_ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0,
                                             local_prefill_max_uncached_share=0)


class Engine(Protocol):
    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> str: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished(self) -> bool: ...


@dataclass
class Workload:
    decodes: int = 8
    decode_prompt: int = 64
    decode_tokens: int = 96
    prefills: int = 12
    prefill_prompt: int = 1024
    prefill_every_s: float = 0.5
    seed: int = 0


@dataclass
class InterferenceResult:
    tpot_p50_ms: float
    tpot_p99_ms: float
    tpot_max_ms: float
    wall_s: float
    ttft_prefill_p50_ms: float
    gaps: list[float] = field(default_factory=list, repr=False)


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [1] + [rng.randrange(5, 4000) for _ in range(length - 1)]


def drive(engine: Engine, workload: Workload) -> InterferenceResult:
    """Start the decode streams, then release one long prefill every prefill_every_s while they run."""
    rng = random.Random(workload.seed)
    decode_params = SamplingParams(temperature=0, max_tokens=workload.decode_tokens, ignore_eos=True)
    decodes = {engine.add_request(_prompt(rng, workload.decode_prompt), decode_params) for _ in range(workload.decodes)}
    prefill_prompts = [_prompt(rng, workload.prefill_prompt) for _ in range(workload.prefills)]
    last_seen: dict[str, float] = {}
    gaps: list[float] = []
    submitted: dict[str, float] = {}
    ttfts: list[float] = []
    start = time.monotonic()
    while engine.has_unfinished() or prefill_prompts:
        now = time.monotonic()
        if prefill_prompts and now - start >= len(submitted) * workload.prefill_every_s:
            request_id = engine.add_request(prefill_prompts.pop(), SamplingParams(temperature=0, max_tokens=2))
            submitted[request_id] = now
        for out in engine.step():
            _record(out, time.monotonic(), decodes, last_seen, gaps, submitted, ttfts)
    return InterferenceResult(_ms(_quantile(gaps, 0.5)), _ms(_quantile(gaps, 0.99)), _ms(max(gaps)),
                              time.monotonic() - start, _ms(statistics.median(ttfts)), gaps)


def _record(out: RequestOutput, now: float, decodes: set[str], last_seen: dict[str, float], gaps: list[float],
            submitted: dict[str, float], ttfts: list[float]) -> None:
    if out.request_id in submitted and out.new_token_ids:
        ttfts.append(now - submitted.pop(out.request_id))
    if out.request_id not in decodes or not out.new_token_ids:
        return
    if out.request_id in last_seen:
        gap = (now - last_seen[out.request_id]) / len(out.new_token_ids)
        gaps.extend([gap] * len(out.new_token_ids))
    last_seen[out.request_id] = now


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class _Colocated:
    """LLMEngine.step has no timeout argument; this keeps one call shape for both engines."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        return self.engine.add_request(prompt, params, request_id)

    def step(self) -> list[RequestOutput]:
        return self.engine.step() if self.engine.has_unfinished() else _idle()

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()


def _idle() -> list[RequestOutput]:
    time.sleep(0.005)
    return []


def role_switch_latencies(engine: DisaggregatedEngine, switches: int = 6) -> list[float]:
    """Swap the two workers' roles back and forth while idle; seconds from SetRole to applied."""
    before = len(engine.role_switches)
    for index in range(switches):
        first, second = ("decode", "prefill") if index % 2 == 0 else ("prefill", "decode")
        engine.set_role(0, first)
        engine.set_role(1, second)
        deadline = time.monotonic() + 10
        while len(engine.role_switches) < before + 2 * (index + 1) and time.monotonic() < deadline:
            engine.step()
    return engine.role_switches[before:]


def run_benchmark(model: str, workload: Workload, out_dir: Path, transport: str = "shm") -> dict[str, Any]:
    console = Console(stderr=True)
    settings = EngineSettings(max_num_batched_tokens=512)
    console.print("[bold]colocated[/bold]: one engine, 2 threads")
    torch.set_num_threads(2)
    colocated = drive(_Colocated(LLMEngine(model, settings)), workload)
    console.print("[bold]disaggregated[/bold]: 1 prefill + 1 decode worker, 1 thread each")
    engine = DisaggregatedEngine(model, settings, DeploymentSettings(transport=transport, threads_per_worker=1),
                                 FIXED_SPLIT_ALWAYS_REMOTE)
    try:
        disaggregated = drive(engine, workload)
        switches = role_switch_latencies(engine)
        transfers = engine.transfers
    finally:
        engine.shutdown()
    data = {
        "model": model, "transport": transport, "workload": asdict(workload), "machine": machine_info(),
        "colocated": _public(colocated), "disaggregated": _public(disaggregated),
        "ratio_p99_tpot_disaggregated_over_colocated": round(disaggregated.tpot_p99_ms / colocated.tpot_p99_ms, 3),
        "kv_transfer": {"requests": transfers.requests, "bytes": transfers.bytes,
                        "send_seconds": round(transfers.send_seconds, 4),
                        "hidden_behind_prefill_fraction": round(transfers.hidden_fraction, 3)},
        "role_switch_ms": [_ms(s) for s in switches],
    }
    _write(out_dir, data)
    return data


def _public(result: InterferenceResult) -> dict[str, float]:
    return {k: v for k, v in asdict(result).items() if k != "gaps"}


def _write(out_dir: Path, data: dict[str, Any]) -> None:
    rows = [[name, f"{data[name]['tpot_p50_ms']:.1f}", f"{data[name]['tpot_p99_ms']:.1f}",
             f"{data[name]['tpot_max_ms']:.1f}", f"{data[name]['ttft_prefill_p50_ms']:.0f}"]
            for name in ("colocated", "disaggregated")]
    kv = data["kv_transfer"]
    switches = data["role_switch_ms"] or [0.0]
    tables = [
        Table("Decode time per output token under a stream of long prefills",
              ["configuration", "TPOT p50 ms", "TPOT p99 ms", "TPOT max ms", "prefill TTFT p50 ms"], rows),
        Table("KV transfer and role switching", ["measure", "value"], [
            ["p99 TPOT disaggregated / colocated (goal ≤ 0.5)",
             str(data["ratio_p99_tpot_disaggregated_over_colocated"])],
            ["KV bytes sent", str(kv["bytes"])],
            ["share of KV sending hidden behind prefill compute", f"{kv['hidden_behind_prefill_fraction']:.0%}"],
            ["role switch latency ms (median / max; goal < 50)",
             f"{statistics.median(switches):.1f} / {max(switches):.1f}"],
        ]),
    ]
    chart = BarChart("tpot_p99.png", "p99 time per output token", "ms", ["colocated", "disaggregated"],
                     [data["colocated"]["tpot_p99_ms"], data["disaggregated"]["tpot_p99_ms"]])
    files = write_report(out_dir, data, "agentserve disaggregation benchmark", tables, chart)
    Console().print(files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="small")
    parser.add_argument("--transport", default="shm", choices=["shm", "tcp"])
    parser.add_argument("--decodes", type=int, default=Workload.decodes)
    parser.add_argument("--decode-tokens", type=int, default=Workload.decode_tokens)
    parser.add_argument("--prefills", type=int, default=Workload.prefills)
    parser.add_argument("--prefill-prompt", type=int, default=Workload.prefill_prompt)
    parser.add_argument("--prefill-every", type=float, default=Workload.prefill_every_s)


def run(args: argparse.Namespace) -> None:
    workload = Workload(decodes=args.decodes, decode_tokens=args.decode_tokens, prefills=args.prefills,
                        prefill_prompt=args.prefill_prompt, prefill_every_s=args.prefill_every)
    run_benchmark(args.model, workload, args.out, args.transport)
