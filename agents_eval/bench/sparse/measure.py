"""Timing one engine step over a long history, dense and with history blocks skipped, on the engine's own model
runner: a decode step (one token per stream) and a prefill chunk (a new observation after the history).

Every stream has its own KV blocks, consecutive as a fresh request's are, so the dense step reads them in place
as the engine does today. The history's K and V are seeded random values rather than a prefill's (attention
costs the same whatever the values; a 16 x 6k-token prefill would take minutes here). Skipped blocks are picked
at random among those no policy skips (the first block, with the attention sinks, and the last 256 tokens), the
same for every stream, and attended through the engine's block-sparse path (`spans_skipping_blocks`). Dense and
sparse steps alternate, so a slower moment of a shared machine hits both alike; figures are medians.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from engine.core.sampling.sampler import SamplingParams
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence
from engine.model.mask import MaskedSpan, QuerySelection, spans_skipping_blocks
from engine.model.runner import ModelRunner

RECENT_TOKENS = 256  # never skipped, as QuerySelection's default keeps them
PARAMS = SamplingParams(temperature=0, max_tokens=1 << 20, ignore_eos=True)


@dataclass(frozen=True)
class Case:
    """One shape: streams, history tokens, and the new tokens each stream computes (1: a decode step)."""

    batch: int
    context: int
    new_tokens: int


def fill_kv(runner: ModelRunner, seed: int) -> None:
    """Seeded random K and V in every slot, at the scale of a real model's (unit variance per element)."""
    generator = torch.Generator().manual_seed(seed)
    for cache in runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=generator, dtype=torch.float32).to(cache.dtype))


def skipped_blocks(context: int, block_size: int, share: float, seed: int) -> list[int]:
    """share of the history's blocks, picked at random among those past the first and before the recent window."""
    num_blocks = context // block_size
    candidates = list(range(1, num_blocks - RECENT_TOKENS // block_size))
    count = min(len(candidates), round(share * num_blocks))
    return sorted(random.Random(seed).sample(candidates, count))


def make_batch(case: Case, block_size: int, blocks_per_stream: int, spans: list[MaskedSpan],
               selection: QuerySelection | None = None) -> tuple[ScheduledBatch, list[list[int]]]:
    """The streams of a step: history computed, case.new_tokens to go; stream i owns consecutive blocks."""
    batch, tables = ScheduledBatch(), []
    for index in range(case.batch):
        total = case.context + case.new_tokens
        seq = Sequence(f"s{index}", [7] * total, PARAMS, masked_spans=tuple(spans), selection=selection)
        if case.new_tokens == 1:  # a decode: the new token is the last output
            seq.prompt_token_ids, seq.output_token_ids = [7] * case.context, [7]
        seq.num_computed_tokens = case.context
        batch.add(seq, case.new_tokens)
        first = index * blocks_per_stream
        tables.append(list(range(first, first + -(-total // block_size))))
    return batch, tables


def spans_for(case: Case, block_size: int, share: float, seed: int) -> list[MaskedSpan]:
    """The skipped blocks as masked spans in force from the step's first query on."""
    blocks = skipped_blocks(case.context, block_size, share, seed)
    return spans_skipping_blocks(blocks, block_size, case.context)


def time_step(runner: ModelRunner, batch: ScheduledBatch, tables: list[list[int]]) -> float:
    """Seconds for one step; the step rewrites the same slots each time (nothing is appended)."""
    start = time.perf_counter()
    runner.execute(batch, tables)
    return time.perf_counter() - start


def interleaved_medians(runner: ModelRunner, steps: dict[str, tuple[ScheduledBatch, list[list[int]]]],
                        repeats: int) -> dict[str, dict[str, float]]:
    """Each variant's step, round after round (one warm-up round first): median and spread in seconds."""
    for batch, tables in steps.values():
        time_step(runner, batch, tables)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, (batch, tables) in steps.items():
            times[name].append(time_step(runner, batch, tables))
    return {name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
            for name, values in times.items()}
