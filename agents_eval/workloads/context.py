"""Fitting sessions into the model's context: every request's prompt plus its reply stays within max_model_len.

A request is the system message, the history its turn keeps, its new messages, each wrapped in the chat
template's markers, then the generation prompt, then the reply. The default template (trajectory.template.default)
costs 13 tokens a user or assistant message and 14 a system message with the built-in tokenizer, and 8 for
bos plus the generation prompt; we allow 16 a message for a checkpoint template's slightly longer markers.
Function calling adds the tools block (72 tokens for a synthetic agent's one function) to every prompt and
the call id and name to each tool message (21 tokens), both measured with the default template and the
built-in tokenizer; we allow 96 and 24.

A turn that does not fit has its new content cut to fit, when at least one token of it does; otherwise it and
every later turn of its session are dropped (an append-only history only grows, so later turns fit even less).
The cut is the workload's own (`Cut`): by words for text of single-token words, by the tokenizer for tool output.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Protocol

from agents_eval.workloads.text import NoExactPrefixError, WordCut
from agents_eval.workloads.types import APPEND, SessionScript, Turn

MESSAGE_OVERHEAD_TOKENS = 16
PROMPT_OVERHEAD_TOKENS = 8
TOOLS_BLOCK_TOKENS = 96
TOOL_MESSAGE_EXTRA_TOKENS = 24


class Cut(Protocol):
    def count(self, text: str) -> int: ...

    def cut(self, text: str, n_tokens: int) -> str:
        """A prefix of `text` of exactly `n_tokens` tokens."""
        ...


@dataclass
class FitCounts:
    """What fitting removed, summed over sessions: goes into a workload's settings."""

    cut_turns: int = 0  # turns whose new content was shortened
    cut_tokens: int = 0  # tokens removed from those
    dropped_turns: int = 0
    dropped_sessions: int = 0  # sessions whose first turn could not fit at all

    def as_settings(self) -> dict[str, int]:
        return {"cut_turns": self.cut_turns, "cut_tokens": self.cut_tokens, "dropped_turns": self.dropped_turns,
                "dropped_sessions": self.dropped_sessions}


@dataclass
class ContextFit:
    max_model_len: int | None  # None: no limit
    message_overhead: int = MESSAGE_OVERHEAD_TOKENS
    prompt_overhead: int = PROMPT_OVERHEAD_TOKENS
    tool_message_extra: int = 0  # on top of message_overhead, per tool message
    cutter: Cut = field(default_factory=WordCut)
    counts: FitCounts = field(default_factory=FitCounts)

    def fit(self, session: SessionScript) -> SessionScript | None:
        """The session cut to fit, or None when not even its first turn does."""
        if self.max_model_len is None:
            return session
        turns: list[Turn] = []
        history = messages = previous_output = tool_messages = 0
        for index, turn in enumerate(session.turns):
            kept, kept_messages = (history, messages) if turn.history == APPEND else (previous_output, min(index, 1))
            kept_tools = tool_messages if turn.history == APPEND else 0
            new_tools = sum(message["role"] == "tool" for message in turn.new_messages)
            fixed = (self._fixed_tokens(session, turn, kept, kept_messages)
                     + (kept_tools + new_tools) * self.tool_message_extra)
            fitted = _cut_to(turn, self.max_model_len - fixed, self.cutter, self.counts)
            if fitted is None:
                self.counts.dropped_turns += len(session.turns) - index
                break
            turns.append(fitted)
            history = kept + fitted.new_tokens + fitted.max_output_tokens
            messages = kept_messages + len(fitted.new_messages) + 1
            tool_messages = kept_tools + new_tools
            previous_output = fitted.max_output_tokens
        if not turns:
            self.counts.dropped_sessions += 1
            return None
        return replace(session, turns=tuple(turns))

    def fit_all(self, sessions: list[SessionScript]) -> list[SessionScript]:
        fitted = (self.fit(session) for session in sessions)
        return [session for session in fitted if session is not None]

    def _fixed_tokens(self, session: SessionScript, turn: Turn, kept: int, kept_messages: int) -> int:
        """Everything in the request but the new content: system, kept history, markers, the reply."""
        message_count = bool(session.system) + kept_messages + len(turn.new_messages)
        return (session.system_tokens + kept + message_count * self.message_overhead + self.prompt_overhead
                + turn.max_output_tokens)


def _cut_to(turn: Turn, room: int, cutter: Cut, counts: FitCounts) -> Turn | None:
    """The turn with its new content cut to `room` tokens (from its last message), or None below one token."""
    if turn.new_tokens <= room:
        return turn
    if room < 1:
        return None
    last = turn.new_messages[-1]
    in_last = cutter.count(last["content"])
    for keep in range(in_last - (turn.new_tokens - room), 0, -1):  # one fewer when no prefix has exactly `keep`
        with contextlib.suppress(NoExactPrefixError):
            content = cutter.cut(last["content"], keep)
            new_tokens = turn.new_tokens - (in_last - keep)
            counts.cut_turns += 1
            counts.cut_tokens += turn.new_tokens - new_tokens
            return replace(turn, new_messages=(*turn.new_messages[:-1], {**last, "content": content}),
                           new_tokens=new_tokens)
    return None
