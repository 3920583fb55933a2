"""The generator shared by the synthetic agent workloads (webarena, swe): a `SessionShape` says how long
sessions are and how big each turn is in each phase; this module adds open-loop Poisson session arrivals,
tool gaps, the think/act swing, prompt text, the context fit and truncation. Observations after the first
turn are `tool` messages by default, user messages with `observations="user"` (`types`). The system prompt
and the first turn's task are single-token words (`text`); every later observation is its tool's output
(`observations`: shell listings and logs, accessibility trees), redundant as real output is, so pruning
has something to remove; all are exact in tokens.

A turn's planned arrival is its session's start plus, for each earlier turn, `assumed_reply_s` (the reply)
and the tool gap; its phase is drawn from the swing window holding that time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents_eval.workloads.arrivals import ToolGaps, poisson_starts
from agents_eval.workloads.context import (
    PROMPT_OVERHEAD_TOKENS,
    TOOL_MESSAGE_EXTRA_TOKENS,
    TOOLS_BLOCK_TOKENS,
    ContextFit,
    Cut,
)
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.text import TokenText
from agents_eval.workloads.tool_outputs import ToolOutputs
from agents_eval.workloads.types import TOOL_OBSERVATIONS, USER_OBSERVATIONS, SessionScript, Turn, Workload
from engine.model.tokenizer import Tokenizer


class SessionShape(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def history(self) -> str: ...

    @property
    def gaps(self) -> ToolGaps: ...

    @property
    def tool(self) -> str:
        """The function whose results are this agent's observations."""
        ...

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
    observations: str = TOOL_OBSERVATIONS  # TOOL_OBSERVATIONS | USER_OBSERVATIONS

    def __post_init__(self) -> None:
        if self.observations not in (TOOL_OBSERVATIONS, USER_OBSERVATIONS):
            raise ValueError(f"observations must be {TOOL_OBSERVATIONS!r} or {USER_OBSERVATIONS!r}, "
                             f"not {self.observations!r}")

    def context_fit(self, cutter: Cut) -> ContextFit:
        if self.observations == USER_OBSERVATIONS:
            return ContextFit(self.max_model_len, cutter=cutter)
        return ContextFit(self.max_model_len, tool_message_extra=TOOL_MESSAGE_EXTRA_TOKENS,
                          prompt_overhead=PROMPT_OVERHEAD_TOKENS + TOOLS_BLOCK_TOKENS, cutter=cutter)

    def settings(self) -> dict[str, object]:
        return {"seed": self.seed, "rate": self.rate, "duration_s": self.duration_s,
                "max_sessions": self.max_sessions, "max_requests": self.max_requests,
                "length_scale": self.length_scale, "time_scale": self.time_scale,
                "max_model_len": self.max_model_len, "assumed_reply_s": self.assumed_reply_s,
                "observations": self.observations}


def tool_schema(name: str) -> dict[str, Any]:
    """The chat `tools` entry of an agent's one function: it takes the action as one string."""
    return {"type": "function", "function": {"name": name, "description": f"Run a {name} action.",
                                             "parameters": {"type": "object",
                                                            "properties": {"action": {"type": "string"}},
                                                            "required": ["action"]}}}


def scaled_tokens(tokens: float, length_scale: float) -> int:
    return max(1, round(tokens * length_scale))


def token_text(tokenizer: Tokenizer | TokenText | None, seed: int) -> TokenText:
    """Prompt text seeded by the build's seed, over the given tokenizer (the built-in one for None)."""
    if isinstance(tokenizer, TokenText):
        return tokenizer.with_seed(seed)
    return TokenText.builtin(seed) if tokenizer is None else TokenText(tokenizer, seed)


SessionMaker = Callable[["SyntheticOptions", "Texts", int, float, str, int], SessionScript]


def build_synthetic(shape: SessionShape, options: SyntheticOptions, text: TokenText,
                    session: SessionMaker | None = None) -> Workload:
    """The workload of sessions of this shape; `session(options, texts, index, start, system, system_tokens)`
    makes each one where the shape has its own turn structure (one task and its observations otherwise)."""
    make = session or (lambda *args: _session(shape, *args))
    starts = poisson_starts(random.Random(options.seed), options.rate, options.duration_s, options.max_sessions)
    system_tokens = shape.system_tokens(options.length_scale)
    system = text.block((shape.name, "system"), system_tokens)
    outputs = ToolOutputs(text.tokenizer, options.seed)
    scripts = [make(options, Texts(text, outputs), index, start, system, system_tokens)
               for index, start in enumerate(starts)]
    fit = options.context_fit(outputs.cutter)
    sessions = fit.fit_all(scripts)
    last_planned = max((t.planned_at_s or 0.0 for s in sessions for t in s.turns), default=0.0)
    settings = {**options.settings(), "shape": shape.settings(options.length_scale),
                "tool_gaps": shape.gaps.settings(options.time_scale),
                "swing": options.swing.settings(max(last_planned, options.duration_s)),
                "context_fit": fit.counts.as_settings(), "generated_sessions": len(scripts)}
    return Workload(shape.name, tuple(sessions), settings).truncate(options.max_requests)


@dataclass(frozen=True)
class Texts:
    """A session's text: the task in single-token words, observations as its tool prints them."""

    words: TokenText
    outputs: ToolOutputs

    def turn(self, session_id: str, step: int, tool: str, n_tokens: int) -> str:
        if step == 0:
            return self.words.block((session_id, step), n_tokens)
        return self.outputs.text(tool, (session_id, step), n_tokens)


def _session(shape: SessionShape, options: SyntheticOptions, texts: Texts, index: int, start: float,
             system: str, system_tokens: int) -> SessionScript:
    rng = random.Random(f"{options.seed}:{shape.name}:{index}")
    session_id = f"{shape.name}-{options.seed}-{index:05d}"
    tools = (tool_schema(shape.tool),) if options.observations == TOOL_OBSERVATIONS else ()
    turns, at = [], start
    for step in range(shape.turn_count(rng)):
        gap = shape.gaps.draw(rng, options.time_scale) if step else 0.0
        if step:
            at += options.assumed_reply_s + gap
        phase = options.swing.draw(rng, at)
        new_tokens, output_tokens = shape.turn_sizes(rng, phase, options.length_scale)
        message = observation_message(step, texts.turn(session_id, step, shape.tool, new_tokens), shape.tool,
                                      bool(tools))
        turns.append(Turn(start if step == 0 else None, gap, (message,), new_tokens, output_tokens, phase,
                          shape.history, at, tools))
    return SessionScript(session_id, start, system, tuple(turns), system_tokens)


def observation_message(step: int, content: str, tool: str, as_tool: bool) -> dict[str, str]:
    """The first turn's task is a user message; later observations answer the previous reply's call."""
    if step == 0 or not as_tool:
        return {"role": "user", "content": content}
    return {"role": "tool", "tool_call_id": f"call_{step - 1}", "name": tool, "content": content}
