"""Engine decode step time of a GGUF model's weight modes (`dequantize` to float32, `quantized` kept in int4/int8
with CPU kernels) at batch 1 and 16: the measurement behind configs/engine.yaml's `gguf_weights`. The modes
alternate round by round, so a busy host's load falls on both alike; the median and fastest step are printed.

    .venv/bin/python scripts/weights_mode_steps.py [--model smollm2] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.loader import GGUFWeights

MODES: tuple[GGUFWeights, ...] = ("dequantize", "quantized")


def decode_step_times(engine: LLMEngine, batch: int, context: int, steps: int) -> tuple[float, list[float]]:
    """The prefill's tokens/s of `batch` greedy streams' own `context`-token prompts, and the wall seconds of
    each decode step that follows."""
    vocab = engine.config.vocab_size
    for stream in range(batch):
        prompt = [100 + (7 * i + 13 * stream) % (vocab - 100) for i in range(context)]
        engine.add_request(prompt, SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True))
    start = time.perf_counter()
    while any(seq.num_computed_tokens < context for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # the prompts, in chunks
    prefill_tokens_per_s = batch * context / (time.perf_counter() - start)
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    engine.reset_prefix_cache()
    return prefill_tokens_per_s, times[1:-1]  # the first may finish prefills, the last only ends streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    engines = {mode: LLMEngine(args.model, EngineSettings(gguf_weights=mode, num_threads=args.threads,
                                                          num_kv_blocks=1024, max_num_batched_tokens=512))
               for mode in MODES}
    times: dict[tuple[str, int], list[float]] = {(mode, batch): [] for mode in MODES for batch in (1, 16)}
    for mode in MODES:
        decode_step_times(engines[mode], 1, 32, 4)  # warm-up
    for _ in range(args.rounds):
        for batch in (1, 16):
            for mode in MODES:
                prefill, samples = decode_step_times(engines[mode], batch, args.context, args.steps)
                times[mode, batch] += samples
                print(f"  {mode} batch {batch}: round median {statistics.median(samples) * 1e3:.1f} ms, prefill "
                      f"{prefill:.0f} tok/s", flush=True)
    for (name, batch), samples in times.items():
        median = statistics.median(samples)
        print(f"{name:>10} batch {batch:>2}: step median {median * 1e3:6.1f} ms, fastest {min(samples) * 1e3:6.1f} ms "
              f"({batch / median:6.1f} tok/s); {len(samples)} steps", flush=True)
    print(f"1-minute load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, {args.threads} threads")


if __name__ == "__main__":
    main()
