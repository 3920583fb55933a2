"""The engine benchmark's workload (seeded random prompts with fixed output lengths) and run results."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

FIRST_ORDINARY_TOKEN = 3  # ids 0-2 are pad/unk, bos and eos in the built-in vocabularies


@dataclass(frozen=True)
class BenchRequest:
    prompt: list[int]
    output_len: int  # every request generates exactly this many tokens


@dataclass(frozen=True)
class LengthRange:
    low: int
    high: int  # inclusive

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


class Stopwatch:
    """Wall time and this process's CPU time (every thread) since it was made; the CPU time is less
    skewed than the wall time when other work shares the machine."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self._wall, time.process_time() - self._cpu


@dataclass
class RunResult:
    """One configuration's run over the workload."""

    label: str
    wall_s: float
    cpu_s: float
    tokens: list[list[int]]  # per request, its own output tokens only
    generated_tokens: int  # everything the configuration computed, padding waste included

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    def to_json(self, workload: list[BenchRequest], reference: list[list[int]] | None) -> dict[str, Any]:
        report = {
            "label": self.label,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "output_tokens": self.output_tokens,
            "generated_tokens": self.generated_tokens,
            "output_tokens_per_s": self.tokens_per_s,
            "all_lengths_ok": all(len(t) == r.output_len for t, r in zip(self.tokens, workload, strict=True)),
        }
        if reference is not None:
            matches = sum(ours == theirs for ours, theirs in zip(reference, self.tokens, strict=True))
            report["requests_matching_engine"] = matches
        return report


def random_prompt(rng: random.Random, length: int, vocab_size: int, bos_token_id: int) -> list[int]:
    return [bos_token_id] + [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(length - 1)]


def make_workload(num_requests: int, inputs: LengthRange, outputs: LengthRange, vocab_size: int,
                  bos_token_id: int, seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [BenchRequest(random_prompt(rng, inputs.draw(rng), vocab_size, bos_token_id), outputs.draw(rng))
            for _ in range(num_requests)]
