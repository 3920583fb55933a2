"""Prefill/decode interference: ongoing decodes while long prefills arrive on a planned schedule (prefill i
at start + i x period, the same for every engine), on one colocated engine (both cores) against one prefill +
one decode worker process (one core each), in one run. Reports p50/p99 time per output token of the decode
streams, the share of KV sending hidden behind prefill compute, and role-switch latency on idle workers and
on busy ones (`disagg_bench_switch.py`).

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

from agents_eval.bench.disagg.switch import BusyLoad, BusyShape, measure_switches, random_prompt
from agents_eval.bench.disagg.workload import MAX_NUM_BATCHED_TOKENS, InterferenceWorkload
from agents_eval.harness.report import BarChart, Table, goal, machine_info, write_report
from agents_eval.harness.stats import percentile
from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings

# The interference measurement wants every request to cross the wire on a fixed split.
FIXED_SPLIT_ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0,
                                             local_prefill_max_uncached_share=0)
MAX_WAIT_S = 0.05  # longest a disaggregated step waits for worker events
IDLE_SLEEP_S = 0.005  # the colocated engine's wait when it has nothing to run
ROLE_SWAPS = 6  # each swap switches both workers
SWITCH_GOAL_MS = 50.0  # goal: every role switch applies within this


class Engine(Protocol):
    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> str: ...
    def step(self, timeout_s: float) -> list[RequestOutput]: ...
    def has_unfinished(self) -> bool: ...


def busy_shape(workload: InterferenceWorkload) -> BusyShape:
    return BusyShape(workload.decodes, workload.decode_prompt, workload.decode_tokens, workload.prefill_prompt,
                     workload.seed + 1)


@dataclass
class InterferenceResult:
    tpot_p50_ms: float
    tpot_p99_ms: float
    tpot_max_ms: float
    wall_s: float
    ttft_prefill_p50_ms: float  # from each prefill's planned release
    release_lag_max_ms: float  # the latest a prefill was submitted after its planned release
    gaps: list[float] = field(default_factory=list, repr=False)


def prefills_due(elapsed_s: float, period_s: float, total: int) -> int:
    """How many prefills the plan has released by elapsed_s: prefill i at i * period_s, whatever answered."""
    return min(total, int(elapsed_s / period_s) + 1)


class _Streams:
    """Per-token gaps of the decode streams and first-token times of the prefills, as outputs arrive."""

    def __init__(self, decodes: set[str]) -> None:
        self.decodes = decodes
        self.last_seen: dict[str, float] = {}
        self.gaps: list[float] = []
        self.planned: dict[str, float] = {}  # prefill request -> its planned release (monotonic)
        self.ttfts: list[float] = []

    def record(self, outs: list[RequestOutput], now: float) -> None:
        """One engine step's outputs, all seen at now: a request's outputs within one step are one arrival (a
        backlog read at once is not a run of zero-length token gaps)."""
        new_tokens: dict[str, int] = {}
        for out in outs:
            if out.new_token_ids:
                new_tokens[out.request_id] = new_tokens.get(out.request_id, 0) + len(out.new_token_ids)
        for request_id, count in new_tokens.items():
            if request_id in self.planned:
                self.ttfts.append(now - self.planned.pop(request_id))
            if request_id not in self.decodes:
                continue
            if request_id in self.last_seen:
                self.gaps.extend([(now - self.last_seen[request_id]) / count] * count)
            self.last_seen[request_id] = now


def drive(engine: Engine, workload: InterferenceWorkload) -> InterferenceResult:
    """Start the decode streams, then release long prefill i at start + i * prefill_every_s while they run:
    the same schedule for every engine, however fast its prefills answer."""
    rng = random.Random(workload.seed)
    decode_params = SamplingParams(temperature=0, max_tokens=workload.decode_tokens, ignore_eos=True)
    decodes = {engine.add_request(random_prompt(rng, workload.decode_prompt), decode_params)
               for _ in range(workload.decodes)}
    prompts = [random_prompt(rng, workload.prefill_prompt) for _ in range(workload.prefills)]
    streams, period = _Streams(decodes), workload.prefill_every_s
    lags: list[float] = []  # per released prefill: seconds behind its planned release
    start = time.monotonic()
    while engine.has_unfinished() or len(lags) < len(prompts):
        now = time.monotonic()
        while len(lags) < prefills_due(now - start, period, len(prompts)):
            planned = start + len(lags) * period
            request_id = engine.add_request(prompts[len(lags)], SamplingParams(temperature=0, max_tokens=2))
            streams.planned[request_id] = planned
            lags.append(now - planned)
        next_release = start + len(lags) * period if len(lags) < len(prompts) else now + MAX_WAIT_S
        outs = engine.step(min(MAX_WAIT_S, max(0.0, next_release - time.monotonic())))
        streams.record(outs, time.monotonic())
    gaps = streams.gaps
    return InterferenceResult(_ms(_quantile(gaps, 0.5)), _ms(_quantile(gaps, 0.99)), _ms(max(gaps)),
                              time.monotonic() - start, _ms(statistics.median(streams.ttfts)), _ms(max(lags)), gaps)


def _quantile(values: list[float], q: float) -> float:
    return percentile(values, q * 100.0)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class _Colocated:
    """LLMEngine.step has no timeout argument; this keeps one call shape for both engines."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def add_request(self, prompt: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        return self.engine.add_request(prompt, params, request_id)

    def step(self, timeout_s: float) -> list[RequestOutput]:
        if self.engine.has_unfinished():
            return self.engine.step()
        time.sleep(min(timeout_s, IDLE_SLEEP_S))
        return []

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()


def run_benchmark(model: str, workload: InterferenceWorkload, out_dir: Path, transport: str = "shm",
                  settings: EngineSettings | None = None) -> dict[str, Any]:
    workload.validate()
    console = Console(stderr=True)
    settings = settings or EngineSettings(max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)
    console.print("[bold]colocated[/bold]: one engine, 2 threads")
    torch.set_num_threads(2)
    colocated = drive(_Colocated(LLMEngine(model, settings)), workload)
    console.print("[bold]disaggregated[/bold]: 1 prefill + 1 decode worker, 1 thread each")
    engine = WorkerEngine(model, settings, DeploymentSettings(transport=transport, threads_per_worker=1),
                                 FIXED_SPLIT_ALWAYS_REMOTE)
    try:
        disaggregated = drive(engine, workload)
        transfers = engine.transfers  # before the role switches add transfers of their own
        kv = {"requests": transfers.requests, "bytes": transfers.bytes,
              "send_seconds": round(transfers.send_seconds, 4),
              "hidden_behind_prefill_fraction": round(transfers.hidden_fraction, 3)}
        console.print("[bold]role switches[/bold]: idle, then under decode streams and long prefills")
        switches = measure_switches(engine, BusyLoad(engine, busy_shape(workload)), ROLE_SWAPS)
    finally:
        engine.shutdown()
    data = {
        "model": model, "transport": transport, "workload": asdict(workload), "machine": machine_info(),
        "colocated": _public(colocated), "disaggregated": _public(disaggregated),
        "ratio_p99_tpot_disaggregated_over_colocated": round(disaggregated.tpot_p99_ms / colocated.tpot_p99_ms, 3),
        "kv_transfer": kv,
        "role_switch_ms": {"idle": [_ms(s) for s in switches.idle_s], "busy": [_ms(s) for s in switches.busy_s]},
        "role_switch_busy_in_flight": [list(counts) for counts in switches.busy_in_flight],
    }
    data["goals"] = goals(data)
    _write(out_dir, data)
    return data


def goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """p99 TPOT disaggregated at most half the colocated one's; every role switch, idle or busy, under 50 ms."""
    switches = data["role_switch_ms"]
    return [goal("p99 TPOT disaggregated / colocated", 0.5, "max", data["ratio_p99_tpot_disaggregated_over_colocated"]),
            *(goal(f"slowest role switch, {kind} workers (ms)", SWITCH_GOAL_MS, "max",
                   max(switches[kind]) if switches[kind] else None) for kind in ("idle", "busy"))]


def _public(result: InterferenceResult) -> dict[str, float]:
    return {k: v for k, v in asdict(result).items() if k != "gaps"}


def _switch_row(data: dict[str, Any], kind: str, when: str) -> list[str]:
    switches = data["role_switch_ms"][kind]
    return [f"role switch latency ms, {when} (median / max; goal <= {SWITCH_GOAL_MS:g})",
            f"{statistics.median(switches):.1f} / {max(switches):.1f}"]


def _write(out_dir: Path, data: dict[str, Any]) -> None:
    rows = [[name, f"{data[name]['tpot_p50_ms']:.1f}", f"{data[name]['tpot_p99_ms']:.1f}",
             f"{data[name]['tpot_max_ms']:.1f}", f"{data[name]['ttft_prefill_p50_ms']:.0f}",
             f"{data[name]['release_lag_max_ms']:.0f}"]
            for name in ("colocated", "disaggregated")]
    kv = data["kv_transfer"]
    tables = [
        Table("Decode time per output token under a stream of long prefills (released on one planned schedule)",
              ["configuration", "TPOT p50 ms", "TPOT p99 ms", "TPOT max ms", "prefill TTFT p50 ms",
               "release lag max ms"], rows),
        Table("KV transfer and role switching", ["measure", "value"], [
            ["p99 TPOT disaggregated / colocated (goal ≤ 0.5)",
             str(data["ratio_p99_tpot_disaggregated_over_colocated"])],
            ["KV bytes sent", str(kv["bytes"])],
            ["share of KV sending hidden behind prefill compute", f"{kv['hidden_behind_prefill_fraction']:.0%}"],
            _switch_row(data, "idle", "idle workers"),
            _switch_row(data, "busy", "busy workers (decode streams, prefills in flight)"),
        ]),
    ]
    chart = BarChart("tpot_p99.png", "p99 time per output token", "ms", ["colocated", "disaggregated"],
                     [data["colocated"]["tpot_p99_ms"], data["disaggregated"]["tpot_p99_ms"]])
    notes = ["Prefill TTFT counts from each prefill's planned release (start + i x period), so a release that "
             "waited for an engine step is charged to that engine; release lag is that wait.",
             "A busy role switch is asked when every worker has requests in flight (the coordinator's view) and "
             "its last load report shows it running; it applies after the worker's current step."]
    notes += [f"Goal {g['name']}: {g['measured']} ({g['bound']} {g['target']:g}): {'met' if g['met'] else 'missed'}"
              for g in data["goals"]]
    files = write_report(out_dir, data, "agentserve disaggregation benchmark", tables, chart, notes)
    Console().print(files.markdown.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="small")
    parser.add_argument("--transport", default="shm", choices=["shm", "tcp"])
    parser.add_argument("--decodes", type=int, default=InterferenceWorkload.decodes)
    parser.add_argument("--decode-tokens", type=int, default=InterferenceWorkload.decode_tokens)
    parser.add_argument("--prefills", type=int, default=InterferenceWorkload.prefills)
    parser.add_argument("--prefill-prompt", type=int, default=InterferenceWorkload.prefill_prompt)
    parser.add_argument("--prefill-every", type=float, default=InterferenceWorkload.prefill_every_s)


def run(args: argparse.Namespace) -> None:
    workload = InterferenceWorkload(decodes=args.decodes, decode_tokens=args.decode_tokens, prefills=args.prefills,
                        prefill_prompt=args.prefill_prompt, prefill_every_s=args.prefill_every)
    run_benchmark(args.model, workload, args.out, args.transport)
