"""Load or recompute on a real engine: the requests of the trace's first multi-turn sessions, in trace
order, on the `tiny` model with a small device pool over a host tier and a disk tier, one request at a
time. Each trace block becomes `block_tokens` tokens seeded by its hash id, so a reused trace block is a
reused engine block. Reports the blocks loaded and recomputed, each tier's measured bandwidth against the
measured prefill rate, and the tier counters."""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.settings import KVCacheSettings
from predictor.traces import TraceRequest, sessions_and_reuse

ONE_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def prompt_of(request: TraceRequest, block_tokens: int, vocab_size: int) -> list[int]:
    tokens: list[int] = []
    for hash_id in request.hash_ids:
        rng = random.Random(hash_id)
        tokens += [rng.randrange(3, vocab_size) for _ in range(block_tokens)]
    return tokens


def multi_turn(requests: Sequence[TraceRequest], num_requests: int) -> list[TraceRequest]:
    """Every request, in trace order, of the first sessions with more than one, about `num_requests` in all."""
    sessions, _ = sessions_and_reuse(requests)
    counts: dict[int, int] = {}
    for session in sessions:
        counts[session] = counts.get(session, 0) + 1
    chosen: set[int] = set()
    total = 0
    for session in dict.fromkeys(sessions):  # in order of first appearance
        if total >= num_requests:
            break
        if counts[session] > 1:
            chosen.add(session)
            total += counts[session]
    return [request for request, session in zip(requests, sessions, strict=True) if session in chosen]


def replay_on_engine(requests: Sequence[TraceRequest], device_blocks: int, host_blocks: int,
                     block_tokens: int = 16) -> dict[str, Any]:
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="kv-cache-bench-") as folder, \
            tempfile.TemporaryDirectory(prefix="kv-cache-bench-", dir=shm if shm.is_dir() else None) as host:
        kv = KVCacheSettings(host_blocks=host_blocks, host_path=Path(host), disk_path=Path(folder) / "disk")
        engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=device_blocks, block_size=block_tokens,
                                                  max_num_batched_tokens=4096, kv_cache=kv))
        prompts = [prompt_of(r, block_tokens, engine.config.vocab_size) for r in requests]
        limit = min(engine.max_model_len, (device_blocks - 1) * block_tokens)
        prompts = [p[:limit] for p in prompts]
        started = time.perf_counter()
        results = [engine.generate([prompt], ONE_TOKEN)[0] for prompt in prompts]
        wall_s = time.perf_counter() - started
        stats = engine.kv_tier_stats()
        assert stats is not None
        return {"requests": len(prompts), "device_blocks": device_blocks, "host_blocks": host_blocks,
                "block_tokens": block_tokens, "prompt_tokens": sum(map(len, prompts)),
                "cached_tokens": sum(r.num_cached_tokens for r in results), "wall_s": wall_s,
                "prefill_tokens_per_s": engine.step_timer.prefill_tokens_per_s, **stats}
