"""Our engine's side of the engine benchmark: the timed workload run and prefix-cache prefill timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents_eval.bench.engine.workload import BenchRequest, RunResult, Stopwatch
from engine.core.llm_engine import LLMEngine, Prompt
from engine.core.sampling.sampler import SamplingParams

Advance = Callable[[int], None]
WARMUP_PROMPT_LEN = 32
WARMUP_OUTPUT_LEN = 4


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, seed=0)


def warm_up(engine: LLMEngine, prompts: list[list[int]]) -> None:
    """A couple of short requests, then a clean prefix cache."""
    engine.generate([p[:WARMUP_PROMPT_LEN] for p in prompts], greedy(WARMUP_OUTPUT_LEN))
    reset_prefix_cache(engine)


def reset_prefix_cache(engine: LLMEngine) -> None:
    if not engine.kv.reset_prefix_cache():
        raise RuntimeError("prefix cache reset refused: a request still holds KV blocks")


def run_engine(engine: LLMEngine, workload: list[BenchRequest], advance: Advance) -> RunResult:
    """All requests submitted at once, then stepped until every one has finished."""
    tokens: list[list[int]] = [[] for _ in workload]
    stopwatch = Stopwatch()
    index = {engine.add_request(r.prompt, greedy(r.output_len)): i for i, r in enumerate(workload)}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[index[out.request_id]] += out.new_token_ids
            advance(int(out.finished))
    return RunResult("agentserve engine", *stopwatch.read(), tokens, sum(len(t) for t in tokens))


@dataclass
class PrefixCacheTiming:
    prompt_len: int
    cold_s: list[float]
    warm_s: list[float]
    cold_cached_tokens: int
    warm_cached_tokens: int

    @property
    def speedup(self) -> float:
        return statistics.median(self.cold_s) / statistics.median(self.warm_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_len": self.prompt_len,
            "max_tokens": 1,
            "cold_median_s": statistics.median(self.cold_s),
            "warm_median_s": statistics.median(self.warm_s),
            "speedup": self.speedup,
            "cold_num_cached_tokens": self.cold_cached_tokens,
            "num_cached_tokens": self.warm_cached_tokens,
            "cold_samples_s": self.cold_s,
            "warm_samples_s": self.warm_s,
        }


def _timed_single(engine: LLMEngine, prompt: Prompt) -> tuple[float, int]:
    start = time.perf_counter()
    [completion] = engine.generate([prompt], greedy(1))
    return time.perf_counter() - start, completion.num_cached_tokens


def time_prefix_cache(engine: LLMEngine, prompt: list[int], repeats: int,
                      advance: Advance) -> PrefixCacheTiming:
    """One prompt, max_tokens=1: `repeats` runs on an empty prefix cache, then `repeats` on a warm one."""
    cold, warm, cold_cached, warm_cached = [], [], 0, 0
    for _ in range(repeats):
        reset_prefix_cache(engine)
        seconds, cold_cached = _timed_single(engine, prompt)
        cold.append(seconds)
        advance(1)
    for _ in range(repeats):
        seconds, warm_cached = _timed_single(engine, prompt)
        warm.append(seconds)
        advance(1)
    return PrefixCacheTiming(len(prompt), cold, warm, cold_cached, warm_cached)
