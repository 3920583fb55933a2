"""What a request asks its output to match (no grammar library here): a JSON schema, any JSON object, a Lark
grammar or a regular expression. It travels inside `SamplingParams` (pickled to workers) and is compiled where
the tokens are sampled (`engine.core.sampling.grammar`), cached by its text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "json_object", "lark", "regex"]


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    source: str = ""  # the schema's JSON text, the Lark grammar or the regex; empty for json_object
    jump_forward: bool = True  # append the tokens the grammar forces without sampling them
    # when set, the output is free until this text first appears in it; from there on (the trigger included) it
    # must match the grammar: a call the model starts of its own accord (llama.cpp's lazy grammars)
    trigger: str = ""


@dataclass
class GrammarCounters:
    """Cumulative counters of one engine's structured outputs (summed over workers for the metrics)."""

    constrained_requests: int = 0
    forced_tokens: int = 0  # appended by jump-forward, never sampled
    compile_queries: int = 0
    compile_hits: int = 0  # a compiled grammar reused from the cache
    compile_seconds: float = 0.0
    mask_seconds: float = 0.0  # computing and applying the token bitmasks
    mask_steps: int = 0  # steps that masked at least one row

    def add(self, other: GrammarCounters) -> None:
        for name in ("constrained_requests", "forced_tokens", "compile_queries", "compile_hits", "compile_seconds",
                     "mask_seconds", "mask_steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
