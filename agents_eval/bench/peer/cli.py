"""The options of `agentserve bench peer`."""

from __future__ import annotations

import argparse
from pathlib import Path

from agents_eval.bench.peer.bench import run_benchmark
from agents_eval.bench.peer.settings import CONFIGS, PeerSettings

INT_OPTIONS = ("threads", "sessions", "turns", "observation_tokens", "output_tokens", "decode_tokens",
               "prefill_tokens", "repeats", "rounds", "context", "seed")
HELP = {
    "threads": "threads of every server (llama.cpp n_threads and n_threads_batch, agentserve's torch threads)",
    "sessions": "concurrent agent sessions",
    "turns": "turns of each agent session",
    "observation_tokens": "mean tokens of one tool observation (drawn in 0.5x-1.5x)",
    "output_tokens": "output tokens of each agent turn",
    "decode_tokens": "output tokens of each single-stream decode run",
    "prefill_tokens": "prompt tokens of each prefill run (about: text sized by characters)",
    "repeats": "single-stream decode and prefill runs per configuration and round",
    "rounds": "rounds in which the servers take turns for decode and prefill (the median of every run is reported)",
    "context": "llama.cpp's context (n_ctx); must hold the longest session",
    "seed": "seed of the agent sessions' observations",
}


def _configs(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PeerSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default=defaults.model,
                        help="agentserve's model: a built-in GGUF model or a .gguf file (llama.cpp serves the file)")
    parser.add_argument("--configs", type=_configs, default=defaults.configs,
                        help=f"comma-separated subset of {','.join(CONFIGS)}")
    for name in INT_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name), help=HELP[name])


def run(args: argparse.Namespace) -> None:
    settings = PeerSettings(model=args.model, configs=tuple(args.configs),
                            **{name: getattr(args, name) for name in INT_OPTIONS})
    result = run_benchmark(settings, args.out)
    print(result.markdown)
    print(f"report: {result.files.json}, chart: {result.files.chart} ({result.report['bench_wall_s']:.0f} s in all)")
