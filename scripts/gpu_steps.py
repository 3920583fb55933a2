"""Decode step times on a GPU against the attention paths: decode spans attended one by one or together
(`engine.model.attention.DecodeBatch`), with cuDNN attention off (the engine's choice on CUDA) or on. Each row is
32 decode steps of `batch` streams at a context of `context` tokens: the time of a 33-token reply less that of a
1-token one.

    python scripts/gpu_steps.py OUT.json [--model small] [--dtype bfloat16] [--device cuda]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams

CONTEXTS, BATCHES, DECODE_STEPS = (128, 1024, 3072), (1, 8, 32, 64), 32
KV_CACHE_BYTES = 8 << 30  # the longest row's streams at once: 64 x 3,105 tokens of `small` in bfloat16 is 1.6 GB


def reply_s(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> float:
    started = time.perf_counter()
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    return time.perf_counter() - started


def step_ms(engine: LLMEngine, context: int, batch: int) -> float:
    prompts = [[1, *[(7 * j + i) % 4000 + 5 for j in range(context - 1)]] for i in range(batch)]
    reply_s(engine, prompts, 2)  # warm: this shape's kernels, and (with cuDNN) its graphs at these lengths
    return (reply_s(engine, prompts, DECODE_STEPS + 1) - reply_s(engine, prompts, 1)) / DECODE_STEPS * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="small")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    settings = EngineSettings(device=args.device, dtype=args.dtype, enable_prefix_caching=False,
                              max_num_batched_tokens=4096, max_num_seqs=max(BATCHES), kv_cache_bytes=KV_CACHE_BYTES)
    engine = LLMEngine(args.model, settings)
    table = Table("context", "streams", "one by one", "together", "one by one, cuDNN on", "together, cuDNN on",
                  title=f"ms per decode step, {args.model} {args.dtype} on {args.device}")
    rows = []
    for context, batch in itertools.product(CONTEXTS, BATCHES):
        row: dict[str, float | int] = {"context": context, "streams": batch}
        for cudnn, together in itertools.product((False, True), (False, True)):
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            engine.runner.batch_decodes = together
            row[f"{'together' if together else 'one_by_one'}{'_cudnn' if cudnn else ''}_ms"] = step_ms(
                engine, context, batch)
        rows.append(row)
        table.add_row(*(f"{value:.2f}" if isinstance(value, float) else str(value) for value in row.values()))
    Console().print(table)
    args.out.write_text(json.dumps({"model": args.model, "dtype": args.dtype, "device": args.device,
                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
