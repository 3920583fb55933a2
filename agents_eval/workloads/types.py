"""Agent workloads as scripts: sessions of turns that a runner plays through the gateway as real clients.

A turn's prompt is the session's system message, the history its `history` mode keeps, and its
`new_messages`; the runner asks for exactly `max_output_tokens` (ignore_eos) and appends the reply to the
history. Token counts here are of message content only; the chat template's markers come on top
(`agents_eval.workloads.context`).

Observations: the synthetic agents (swe, webarena) speak function calling by default: after the first turn
(the task, a user message) each turn's observation is a `tool` message answering a call of the previous
reply, and every turn offers the session's `tools`. With `observations="user"` they send observations as
user messages, as SWE-agent and WebArena do. Replies are replayed text (ignore_eos), so the assistant message
a client keeps is the reply as streamed; the tool message's `tool_call_id` names the call it stands for.

A turn with `at_s` (trace replay) is due at that time from the run start, and is sent once the previous
reply is in if that comes later; a turn without is sent `tool_gap_s` after the previous reply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

THINK = "think"
ACT = "act"
APPEND = "append"
LAST_ACTION = "last_action"
TOOL_OBSERVATIONS = "tool"
USER_OBSERVATIONS = "user"


@dataclass(frozen=True)
class Turn:
    at_s: float | None  # trace replay: arrival time from the run start (open loop); None: tool_gap_s after the reply
    tool_gap_s: float  # seconds between the previous reply and this turn (0 for the first turn)
    new_messages: tuple[dict[str, str], ...]  # OpenAI chat messages this turn adds
    new_tokens: int  # tokens of the new messages' content in our tokenizer
    max_output_tokens: int  # sent with ignore_eos, so the reply has exactly this many tokens
    phase: str  # THINK (large observation to prefill) or ACT (short, decode-bound)
    history: str  # APPEND: history keeps every turn; LAST_ACTION: system + the previous reply + this turn
    # When the generator planned the turn to arrive (`at_s` for trace replay; for closed-loop turns, the session
    # start plus tool gaps plus an assumed time per reply): what phase windows and `Workload.truncate` go by.
    planned_at_s: float | None = None
    tools: tuple[dict[str, Any], ...] = ()  # chat `tools` the request offers (function calling)


@dataclass(frozen=True)
class SessionScript:
    session_id: str
    start_s: float  # first turn's arrival from the run start (open loop)
    system: str  # the fixed instruction prefix; "" means the session sends no system message
    turns: tuple[Turn, ...]
    system_tokens: int = 0

    def prompt_tokens(self) -> list[int]:
        """Per turn, the content tokens of its whole prompt: system, the history it keeps, its new messages."""
        prompts, history, previous_output = [], 0, 0
        for turn in self.turns:
            kept = history if turn.history == APPEND else previous_output
            prompts.append(self.system_tokens + kept + turn.new_tokens)
            history = kept + turn.new_tokens + turn.max_output_tokens
            previous_output = turn.max_output_tokens
        return prompts

    def planned_times(self) -> list[float]:
        return [_planned_at(self, turn) for turn in self.turns]


@dataclass(frozen=True)
class Workload:
    name: str  # "mooncake" | "webarena" | "swe"
    sessions: tuple[SessionScript, ...]  # sorted by start_s
    settings: dict[str, object]  # everything that shaped it: goes into the report

    @property
    def num_requests(self) -> int:
        return sum(len(session.turns) for session in self.sessions)

    @property
    def input_tokens(self) -> int:
        """New content sent: each session's system prompt once, plus every turn's new messages."""
        return sum(s.system_tokens + sum(t.new_tokens for t in s.turns) for s in self.sessions)

    @property
    def output_tokens(self) -> int:
        return sum(turn.max_output_tokens for session in self.sessions for turn in session.turns)

    @property
    def prompt_tokens(self) -> int:
        """Content tokens of every request's whole prompt, history included (what an engine without caching
        would prefill, template markers aside)."""
        return sum(sum(session.prompt_tokens()) for session in self.sessions)

    def truncate(self, max_requests: int | None = None, duration_s: float | None = None) -> Workload:
        """Cut sessions, never reorder or thin them: every session keeps a prefix of its turns, so each kept
        turn's history is what the full workload had.

        `duration_s` bounds open-loop arrivals: sessions starting at or after it are dropped, and a session is
        cut before its first turn with `at_s` at or after it (closed-loop turns are not bounded by it).
        `max_requests` keeps the turns planned earliest (ties: earlier sessions, then earlier turns); planned
        times rise within a session, so this too cuts each session to a prefix. Sessions left empty are dropped.
        """
        sessions = [_cut_at(s, duration_s) for s in self.sessions if duration_s is None or s.start_s < duration_s]
        if max_requests is not None:
            sessions = _earliest_turns(sessions, max_requests)
        kept = tuple(session for session in sessions if session.turns)
        cut = {"max_requests": max_requests, "duration_s": duration_s}
        return replace(self, sessions=kept, settings={**self.settings, "truncated": cut})


def _planned_at(session: SessionScript, turn: Turn) -> float:
    if turn.planned_at_s is not None:
        return turn.planned_at_s
    return turn.at_s if turn.at_s is not None else session.start_s


def _cut_at(session: SessionScript, duration_s: float | None) -> SessionScript:
    if duration_s is None:
        return session
    late = [i for i, turn in enumerate(session.turns) if turn.at_s is not None and turn.at_s >= duration_s]
    return replace(session, turns=session.turns[: late[0]]) if late else session


def _earliest_turns(sessions: list[SessionScript], max_requests: int) -> list[SessionScript]:
    order = sorted((at, s, t) for s, session in enumerate(sessions) for t, at in enumerate(session.planned_times()))
    counts = [0] * len(sessions)
    for _, s, _ in order[:max_requests]:
        counts[s] += 1
    return [replace(session, turns=session.turns[:count]) for session, count in zip(sessions, counts, strict=True)]
