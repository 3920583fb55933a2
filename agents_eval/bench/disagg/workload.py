"""`bench disagg`'s interference workload: decode streams running while long prompts arrive. Torch-free, so
the simulator's twin of the benchmark (`agents_eval.sim.validation.interference`) plays the same one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from agents_eval.harness.report import check_settings

MAX_NUM_BATCHED_TOKENS = 512  # the benchmark's engines' prefill chunk budget per step


@dataclass
class InterferenceWorkload:
    decodes: int = 8
    decode_prompt: int = 64
    decode_tokens: int = 96
    prefills: int = 12
    prefill_prompt: int = 1024
    prefill_every_s: float = 0.5
    seed: int = 0

    def validate(self) -> None:
        check_settings([
            (min(self.decodes, self.prefills) >= 1, "--decodes and --prefills must be at least 1"),
            (self.decode_tokens >= 2, "--decode-tokens must be at least 2 (a time per token needs two)"),
            (self.decode_prompt >= 2 and self.prefill_prompt >= 2, "prompts must be at least 2 tokens"),
            (self.prefill_every_s > 0, "--prefill-every must be above 0 seconds"),
        ])

    @classmethod
    def of(cls, report: Mapping[str, Any]) -> InterferenceWorkload:
        """The workload a `bench disagg` report ran (its `workload` entry; the defaults where it has none)."""
        given = report.get("workload") or {}
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})
