"""`agentserve bench`: one subcommand per benchmark, each on the harness; `bench --workload W` with no kind
runs the agent benchmark."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "engine": ("agents_eval.bench.engine.bench", "our engine against transformers' generate"),
    "trajectory": ("agents_eval.bench.trajectory.bench", "turn-delta reuse, trace replay, pruning, KV, phase shifts"),
    "disagg": ("agents_eval.bench.disagg.bench", "prefill/decode interference, KV hiding, role switches"),
    "kv-transfer": ("agents_eval.bench.kv_transfer", "KV transfer speed per transport against baselines"),
    "gateway": ("agents_eval.bench.gateway.bench", "gateway overhead over its engine; Responses WebSocket vs chat"),
    "capacity": ("agents_eval.bench.capacity.bench", "capacity controller: reallocation latency, p99 vs fixed splits"),
    "quality": ("agents_eval.bench.quality", "answer retention of pruning and history masks on a real model"),
    "peer": ("agents_eval.bench.peer", "llama.cpp against agentserve on the same GGUF file, same threads"),
    "batcher": ("agents_eval.bench.batcher", "SLO-deadline batching with session fairness against FCFS"),
    "faults": ("agents_eval.bench.faults", "faults under load: workers, Redis, a replica killed; nothing lost"),
    "soak": ("agents_eval.bench.soak", "long agent load: memory, descriptors and latency stay flat"),
    "overload": ("agents_eval.bench.overload", "2x the SLO rate: admitted requests within the SLO, the rest refused"),
    "upstream": ("agents_eval.bench.upstream", "session-affine routing against round-robin over upstream replicas"),
    "kv-cache": ("agents_eval.bench.kv_cache", "improved LFU against LRU and the unbounded bound on a trace"),
    "ipc": ("agents_eval.bench.ipc", "engine messages between processes: pickle against msgspec"),
    "sparse": ("agents_eval.bench.sparse", "block-sparse history attention against dense: decode and prefill"),
    "structured": ("agents_eval.bench.structured", "structured outputs: forced tool calls, json_schema, jump-forward"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (agents_eval); each writes report.json, report.md, a plot",
                       allow_abbrev=False)  # else a kind's --batch is read as the agent bench's --batch-*
    agent_bench = importlib.import_module("agents_eval.bench.agent.bench")  # `bench --workload W`: no kind
    agent_bench.add_arguments(p)
    p.set_defaults(run=agent_bench.run)
    kinds = p.add_subparsers(dest="kind")
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        bench = kinds.add_parser(name, help=help_text)
        module.add_arguments(bench)
        bench.set_defaults(run=module.run)
