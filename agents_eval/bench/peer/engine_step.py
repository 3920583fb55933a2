"""The engine alone, without the gateway: the wall time of one decode step of `LLMEngine.step()` on the peer
bench's model and settings, so a change to the model code is measured without HTTP, streaming or a second
process in the way. A timing script: the machine's load says how far to trust it. With `--profile`, torch's
profiler splits the decode steps' time into the int4 matmuls, the int8 matmuls (the output projection),
attention, the other ops, and what no op accounts for (Python between the ops, the scheduler, sampling).

    python -m agents_eval.bench.peer.engine_step [--config agentserve] [--context 60] [--tokens 128] [--profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import torch

from agents_eval.bench.peer.settings import (
    AGENTSERVE_DEFAULTS,
    AGENTSERVE_QUANTIZED,
    CONFIG_ENV,
    PeerSettings,
    agentserve_env,
)
from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams


def engine_for(config: str, model: str, threads: int) -> LLMEngine:
    """The engine the bench's server for `config` builds: the same environment, read the same way."""
    os.environ.update(agentserve_env(config, threads))
    return LLMEngine(model, EngineSettings())


def decode_steps_s(engine: LLMEngine, context: int, tokens: int) -> list[float]:
    """Wall seconds of each decode step of one greedy stream after a `context`-token prompt."""
    prompt = [100 + (7 * i) % (engine.config.vocab_size - 100) for i in range(context)]
    engine.add_request(prompt, SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True))
    engine.step()  # the request leaves the waiting queue with its first chunk
    while engine.scheduler.running and engine.scheduler.running[0].num_computed_tokens < context:
        engine.step()  # the rest of the prompt, in chunks, and its first token
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    engine.reset_prefix_cache()
    return times


STAGES = (("int4 matmuls", "_weight_int4pack_mm"), ("int8 matmuls (output projection)", "_weight_int8pack_mm"),
          ("attention", "scaled_dot_product"))


def profile_steps(engine: LLMEngine, context: int, tokens: int) -> dict[str, float]:
    """Milliseconds per decode step: the wall time, each stage's ops (self CPU time of the calling thread), the
    other ops, and the rest (no op running: Python, scheduling, sampling's host work)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        times = decode_steps_s(engine, context, tokens)
    per_step: dict[str, float] = defaultdict(float)
    ops = 0
    for event in profiler.key_averages():
        stage = next((name for name, marker in STAGES if marker in event.key), "other ops")
        per_step[stage] += event.self_cpu_time_total / 1e3 / len(times)
        ops += event.count
    wall = statistics.mean(times) * 1e3
    return {"wall step": wall, **per_step, "outside any op": wall - sum(per_step.values()),
            "ops per step": ops / len(times)}


def main() -> None:
    defaults = PeerSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=AGENTSERVE_QUANTIZED, choices=sorted([*CONFIG_ENV, AGENTSERVE_DEFAULTS]))
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--context", type=int, default=60, help="prompt tokens before decoding")
    parser.add_argument("--tokens", type=int, default=128, help="decode steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="split the last repeat's steps by stage")
    args = parser.parse_args()
    engine = engine_for(args.config, args.model, args.threads)
    decode_steps_s(engine, args.context, 4)  # warm-up
    for repeat in range(args.repeats):
        times = decode_steps_s(engine, args.context, args.tokens)
        median = statistics.median(times)
        print(f"repeat {repeat}: decode step median {median * 1e3:.2f} ms ({1 / median:.1f} tok/s), "
              f"fastest {min(times) * 1e3:.2f} ms; 1-minute load {os.getloadavg()[0]:.2f}", flush=True)
    if args.profile:
        split = profile_steps(engine, args.context, args.tokens)
        print("profiled: " + ", ".join(f"{name} {value:.2f}" + ("" if name == "ops per step" else " ms")
                                       for name, value in split.items()), flush=True)


if __name__ == "__main__":
    main()
