"""Time-to-live of a session's KV pin over the tool gap: a moving average of the session's observed gaps
per tool, scaled by a margin and capped; an agent's own announced estimate wins when it gave one."""

from __future__ import annotations

from trajectory.session import SessionState, ToolGap
from trajectory.settings import TTLSettings

NO_TOOL = ""  # gaps after a reply that called no tool (the user's own think time)


def observe_turn_arrival(state: SessionState, now: float, settings: TTLSettings) -> None:
    """A new turn arrived: the gap since the last reply finished updates its tools' averages."""
    if state.reply_finished_at is None:
        return
    gap = max(0.0, now - state.reply_finished_at)
    for tool in state.pending_tools or [NO_TOOL]:
        known = state.tool_gaps.get(tool)
        if known is None:
            state.tool_gaps[tool] = ToolGap(gap)
        else:
            known.ema_s += settings.ema_alpha * (gap - known.ema_s)
            known.count += 1
    state.reply_finished_at = None
    state.announced_tool = None


def pin_ttl(state: SessionState, now: float, settings: TTLSettings) -> float:
    """Seconds to keep the session's KV pinned from now on."""
    _, started_at, estimate = state.announced_tool or ("", now, None)
    if estimate is not None:
        expected = max(0.0, started_at + estimate - now)
    else:
        gaps = [state.tool_gaps[tool].ema_s for tool in state.pending_tools or [NO_TOOL] if tool in state.tool_gaps]
        if not gaps:
            return min(settings.cap_s, settings.default_s)
        expected = max(gaps)
    return min(settings.cap_s, max(settings.floor_s, expected * settings.margin))
