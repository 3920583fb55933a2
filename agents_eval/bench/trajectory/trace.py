"""Mooncake conversation trace replay, scaled down, as a token-count benchmark (arrival times are not kept).

Each `hash_ids` entry names a 512-token block; we give it `512 x length_scale` seeded token ids, the same for
every request naming it, so equal leading ids are equal prefixes. A request's prompt is its blocks cut to
its scaled input length (its last block is partial), clipped to fit the model's context. Requests run in
trace order, a fixed number in flight, with prefix caching on and off.

Sessions: a request continues an earlier one when it starts with all of that one's full blocks (every id
but its last, which is partial and renamed as the conversation grows). The first block is shared by every
request of this trace (a common system prompt), so a continuation must share at least two blocks.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from predictor.traces import TRACE_BLOCK_TOKENS, TraceRequest, sessions_and_reuse

Advance = Callable[[int], None]

@dataclass(frozen=True)
class ScaledRequest:
    prompt: list[int]
    output_tokens: int
    session: int
    reusable_tokens: int  # leading tokens in blocks an earlier request had: the prefix-reuse upper bound
    clipped: bool


@dataclass(frozen=True)
class ReplayCounts:
    prompt_tokens: int
    computed_tokens: int  # sum of num_prompt_tokens - num_cached_tokens
    queries: int  # engine.kv.stats: prompt tokens looked up in the prefix cache
    hits: int  # of those, found cached

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.queries if self.queries else None


def block_tokens(hash_id: int, block_len: int, vocab_size: int, seed: int) -> list[int]:
    """The token ids of one trace block: seeded by the hash id alone, ids 3.. (past bos/eos/unk)."""
    rng = random.Random(f"{seed}:block:{hash_id}")
    return [rng.randrange(3, vocab_size) for _ in range(block_len)]


def block_length(length_scale: float) -> int:
    """Tokens of one trace block at this scale."""
    return max(1, round(TRACE_BLOCK_TOKENS * length_scale))


def scale_requests(requests: list[TraceRequest], length_scale: float, max_model_len: int, vocab_size: int,
                   seed: int) -> list[ScaledRequest]:
    block_len = block_length(length_scale)
    sessions, reused = sessions_and_reuse(requests)
    scaled = []
    for request, session, seen in zip(requests, sessions, reused, strict=True):
        output = max(1, round(request.output_length * length_scale))
        wanted = min(max(2, round(request.input_length * length_scale)), len(request.hash_ids) * block_len)
        length = min(wanted, max_model_len - output - 1)
        blocks = request.hash_ids[: -(-length // block_len)]
        prompt = [t for hash_id in blocks for t in block_tokens(hash_id, block_len, vocab_size, seed)][:length]
        scaled.append(ScaledRequest(prompt, output, session, min(seen * block_len, length - 1), length < wanted))
    return scaled


def replay(engine: LLMEngine, requests: list[ScaledRequest], concurrency: int, advance: Advance) -> ReplayCounts:
    """Run the requests in trace order with at most `concurrency` in flight."""
    pending = deque(requests)
    in_flight = prompt_tokens = computed = 0
    while pending or engine.has_unfinished():
        while pending and in_flight < concurrency:
            request = pending.popleft()
            engine.add_request(request.prompt, SamplingParams(temperature=0, max_tokens=request.output_tokens,
                                                              ignore_eos=True))
            in_flight += 1
        for out in engine.step():
            if out.finished:
                in_flight -= 1
                prompt_tokens += out.num_prompt_tokens
                computed += out.num_prompt_tokens - out.num_cached_tokens
                advance(1)
    return ReplayCounts(prompt_tokens, computed, engine.kv.stats.queries, engine.kv.stats.hits)
