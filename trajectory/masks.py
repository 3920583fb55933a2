"""The default sparse-history policy: keep attention sinks, the system prompt, the instruction, every
assistant turn and the last K observations (`trajectory.observations`, recorded on each `TurnRecord`); older
observations are masked from the current position on.

Rules only accumulate (a span once masked stays masked for later positions), so the KV computed under
earlier rules stays valid and a cold run with the same rules computes the same KV.
"""

from __future__ import annotations

from engine.mask import MaskedSpan
from trajectory.session import SessionState
from trajectory.settings import MaskSettings


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
