"""The sparse-history policies. `age`, the default: keep attention sinks, the system prompt, the instruction, every
assistant turn and the last K observations (`trajectory.observations`, recorded on each `TurnRecord`); older
observations are masked from the current position on.

Rules only accumulate (a span once masked stays masked for later positions), so the KV computed under
earlier rules stays valid and a cold run with the same rules computes the same KV.

`query` and `attention`: no mask from here; the engine picks the history blocks each decode step reads by what
its queries ask or looked at (`engine.model.mask.QuerySelection`), and this module names what it must never skip.
"""

from __future__ import annotations

from engine import MaskedSpan, QuerySelection, ScoredPolicy
from trajectory.session import SessionState
from trajectory.settings import HistorySettings, MaskSettings


def update_masks(state: SessionState, settings: MaskSettings) -> list[MaskedSpan]:
    """Add spans for observations that fell out of the last K; returns the new spans."""
    if not settings.enabled:
        return []
    observations = [turn for turn in state.turns if turn.observation]
    keep = settings.keep_last_tool_observations
    old = observations[:-keep] if keep > 0 else observations
    masked = {span.start for span in state.masked_spans}
    now = state.num_tokens
    added = []
    for turn in old:
        start = max(turn.token_start, settings.sink_tokens)
        if start < turn.token_end and start not in masked:
            added.append(MaskedSpan(start, turn.token_end, now))
    state.masked_spans.extend(added)
    return added


def query_selection(state: SessionState, history: HistorySettings, sink_tokens: int,
                    policy: ScoredPolicy = "query") -> QuerySelection:
    """The `query` (or `attention`) policy for the session's next reply: the history blocks it never skips are
    the sinks, every assistant turn (its tool calls), the first tokens of every observation (which tool said it),
    and the previous and current turn: all from the end of the reply before last on. The turns' blocks are keyed
    by the policy from the end of the first reply on (where prefills may start picking)."""
    replies = [turn for turn in state.turns if turn.role == "assistant"]
    previous_turn_start = replies[-2].token_end if len(replies) >= 2 else 0
    kept = [(turn.token_start, turn.token_end) for turn in replies]
    kept += [(turn.token_start, min(turn.token_end, turn.token_start + history.header_tokens))
             for turn in state.turns if turn.observation]
    return QuerySelection(budget=history.budget, refresh_steps=history.refresh_steps, sink_tokens=sink_tokens,
                          recent_tokens=history.recent_tokens, kept=tuple(sorted(kept)),
                          kept_from=previous_turn_start, policy=policy,
                          picked_from=replies[0].token_end if replies else state.num_tokens)
