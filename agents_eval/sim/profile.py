"""`agentserve profile`: the real engine's step times against batch composition on this machine, fitted into a
calibration file (`calibration`) that `agentserve simulate` reads instead of the roofline.

Rounds of requests with random token ids (prompt lengths and batch sizes from the lists below, replies of
`--max-tokens` with ignore_eos) go through `LLMEngine`; each step's batch is read off the engine's own
scheduler (the sequences it scheduled and their cached tokens) and timed around `LLMEngine.step`.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agents_eval.sim.calibration import StepSample, fit
from agents_eval.sim.cost import StepWork
from engine.sampling import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine
    from engine.scheduler import ScheduledBatch

PROMPT_LENGTHS = (16, 128, 512, 1024)
BATCH_SIZES = (1, 2, 4, 8, 16)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="small", help="built-in model name, GGUF file or checkpoint dir")
    p.add_argument("--out", type=Path, required=True, help="calibration file to write (JSON)")
    p.add_argument("--max-tokens", type=int, default=8, help="reply length of each profiled request")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from agents_eval.report import machine_info

    samples = profile_engine(args.model, args.max_tokens, args.seed)
    calibration = fit(args.model, "float32", samples, machine_info())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    calibration.save(args.out)
    print(f"{len(samples)} steps; coefficients {calibration.coefficients}; wrote {args.out}")


def profile_engine(model: str, max_tokens: int, seed: int) -> list[StepSample]:
    from engine.config import EngineSettings
    from engine.llm_engine import LLMEngine

    # one thread, as each worker of the disaggregated engine has (configs/deployment.yaml threads_per_worker)
    engine = LLMEngine(model, EngineSettings(enable_prefix_caching=False, num_threads=1))
    rng, samples = random.Random(seed), []
    vocab = engine.config.vocab_size
    for length in PROMPT_LENGTHS:
        for size in BATCH_SIZES:
            for _ in range(size):
                engine.add_request([rng.randrange(3, vocab) for _ in range(length)], _params(max_tokens))
            samples += _drain(engine)
    return samples


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _drain(engine: LLMEngine) -> list[StepSample]:
    """Step until every request is done; one sample per step, composition taken from the scheduled batch."""
    samples, schedule = [], engine.scheduler.schedule
    seen: list[StepWork] = []

    def recording(now: float = 0.0) -> ScheduledBatch:
        batch = schedule(now)
        seen.append(StepWork.of((n, s.num_computed_tokens, batch.samples(i))
                                for i, (s, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))))
        return batch

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    try:
        while engine.has_unfinished():
            started = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - started
            if seen and seen[-1].tokens:
                samples.append(StepSample(seen[-1], seconds))
    finally:
        del engine.scheduler.schedule
    return samples
