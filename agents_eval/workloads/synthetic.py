"""The generator shared by the synthetic agent workloads (webarena, swe): a `SessionShape` says how long
sessions are and how big each turn is in each phase; this module adds open-loop Poisson session arrivals,
tool gaps, the think/act swing, prompt text, the context fit and truncation.

A turn's planned arrival is its session's start plus, for each earlier turn, `assumed_reply_s` (the reply)
and the tool gap; its phase is drawn from the swing window holding that time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from agents_eval.workloads.arrivals import ToolGaps, poisson_starts
from agents_eval.workloads.context import ContextFit
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.text import TokenText
from agents_eval.workloads.types import SessionScript, Turn, Workload
from engine.tokenizer import Tokenizer


class SessionShape(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def history(self) -> str: ...

    @property
    def gaps(self) -> ToolGaps: ...

    def system_tokens(self, length_scale: float) -> int: ...

    def turn_count(self, rng: random.Random) -> int: ...

    def turn_sizes(self, rng: random.Random, phase: str, length_scale: float) -> tuple[int, int]:
        """(new content tokens, output tokens) of one turn in this phase."""
        ...

    def settings(self, length_scale: float) -> dict[str, object]: ...


@dataclass(frozen=True)
class SyntheticOptions:
    seed: int
    rate: float  # sessions per second
    duration_s: float  # session arrivals stop here
    max_sessions: int | None
    max_requests: int | None
    length_scale: float
    time_scale: float  # multiplies tool gaps
    max_model_len: int | None
    swing: Swing = field(default_factory=Swing)
    assumed_reply_s: float = 1.0

    def settings(self) -> dict[str, object]:
        return {"seed": self.seed, "rate": self.rate, "duration_s": self.duration_s,
                "max_sessions": self.max_sessions, "max_requests": self.max_requests,
                "length_scale": self.length_scale, "time_scale": self.time_scale,
                "max_model_len": self.max_model_len, "assumed_reply_s": self.assumed_reply_s}


def scaled_tokens(tokens: float, length_scale: float) -> int:
    return max(1, round(tokens * length_scale))


def token_text(tokenizer: Tokenizer | TokenText | None, seed: int) -> TokenText:
    """Prompt text seeded by the build's seed, over the given tokenizer (the built-in one for None)."""
    if isinstance(tokenizer, TokenText):
        return tokenizer.with_seed(seed)
    return TokenText.builtin(seed) if tokenizer is None else TokenText(tokenizer, seed)


def build_synthetic(shape: SessionShape, options: SyntheticOptions, text: TokenText) -> Workload:
    starts = poisson_starts(random.Random(options.seed), options.rate, options.duration_s, options.max_sessions)
    system_tokens = shape.system_tokens(options.length_scale)
    system = text.block((shape.name, "system"), system_tokens)
    scripts = [_session(shape, options, text, index, start, system, system_tokens)
               for index, start in enumerate(starts)]
    fit = ContextFit(options.max_model_len)
    sessions = fit.fit_all(scripts)
    last_planned = max((t.planned_at_s or 0.0 for s in sessions for t in s.turns), default=0.0)
    settings = {**options.settings(), "shape": shape.settings(options.length_scale),
                "tool_gaps": shape.gaps.settings(options.time_scale),
                "swing": options.swing.settings(max(last_planned, options.duration_s)),
                "context_fit": fit.counts.as_settings(), "generated_sessions": len(scripts)}
    return Workload(shape.name, tuple(sessions), settings).truncate(options.max_requests)


def _session(shape: SessionShape, options: SyntheticOptions, text: TokenText, index: int, start: float,
             system: str, system_tokens: int) -> SessionScript:
    rng = random.Random(f"{options.seed}:{shape.name}:{index}")
    session_id = f"{shape.name}-{options.seed}-{index:05d}"
    turns, at = [], start
    for step in range(shape.turn_count(rng)):
        gap = shape.gaps.draw(rng, options.time_scale) if step else 0.0
        if step:
            at += options.assumed_reply_s + gap
        phase = options.swing.draw(rng, at)
        new_tokens, output_tokens = shape.turn_sizes(rng, phase, options.length_scale)
        message = {"role": "user", "content": text.block((session_id, step), new_tokens)}
        turns.append(Turn(start if step == 0 else None, gap, (message,), new_tokens, output_tokens, phase,
                          shape.history, at))
    return SessionScript(session_id, start, system, tuple(turns), system_tokens)
