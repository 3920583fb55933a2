from __future__ import annotations

import json
import zlib

import pytest

from engine.model.mask import MaskedSpan
from trajectory.masks import update_masks
from trajectory.session import SessionState, ToolGap, TurnRecord
from trajectory.settings import MaskSettings, TrajectorySettings
from trajectory.template.incremental import RenderedTurn
from trajectory.template.types import Message


def state_with_tool_turns(count: int) -> SessionState:
    state = SessionState("s")
    position = 0
    for index in range(count):
        role = "tool" if index % 2 else "assistant"
        ids = tuple(range(position, position + 10))
        state.rendered.append(RenderedTurn(Message(role, f"turn {index}"), f"turn {index}", ids))
        state.turns.append(TurnRecord(role, position, position + 10, tool="shell" if role == "tool" else None,
                                      observation=role == "tool"))
        position += 10
    return state


def test_old_tool_observations_are_masked_from_now_on_once() -> None:
    state = state_with_tool_turns(8)  # tool turns at 10-20, 30-40, 50-60, 70-80
    added = update_masks(state, MaskSettings(keep_last_tool_observations=2, sink_tokens=4))
    assert added == [MaskedSpan(10, 20, 80), MaskedSpan(30, 40, 80)]
    assert update_masks(state, MaskSettings(keep_last_tool_observations=2)) == []
    assert update_masks(state, MaskSettings(enabled=False)) == []


def test_state_round_trips_and_is_compact() -> None:
    state = state_with_tool_turns(6)
    state.masked_spans.append(MaskedSpan(10, 20, 60))
    state.tool_gaps["shell"] = ToolGap(2.5, 3)
    state.pending_tools = ["shell"]
    state.reply_finished_at = 1700000000.5
    state.announced_tool = ("shell", 1700000001.0, 30.0)
    data = state.to_bytes()
    again = SessionState.from_bytes(data)
    assert again == state
    assert again.token_ids == list(range(60))
    assert len(data) < len(zlib.decompress(data)) / 2


def test_sessions_stored_before_observations_were_recorded_count_tool_messages() -> None:
    payload = json.loads(zlib.decompress(state_with_tool_turns(4).to_bytes()))
    for turn in payload["turns"]:
        del turn["observation"]
    again = SessionState.from_bytes(zlib.compress(json.dumps(payload).encode()))
    assert [turn.observation for turn in again.turns] == [False, True, False, True]


def test_unknown_format_version_is_refused() -> None:
    payload = json.loads(zlib.decompress(SessionState("s").to_bytes()))
    payload["version"] = 99
    with pytest.raises(ValueError, match="format version 99"):
        SessionState.from_bytes(zlib.compress(json.dumps(payload).encode()))


def test_turn_block_range() -> None:
    assert TurnRecord("tool", 30, 70).block_range(16) == (1, 5)


def test_trajectory_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrajectorySettings().masks.keep_last_tool_observations == 2
    monkeypatch.setenv("AGENTSERVE_TRAJECTORY_TTL__CAP_S", "7.5")
    assert TrajectorySettings().ttl.cap_s == 7.5


def test_a_state_serialised_again_encodes_only_its_new_turns_and_reads_back_whole() -> None:
    state = state_with_tool_turns(4)
    first = state.to_bytes()
    history = state._history
    more = state_with_tool_turns(7)
    state.rendered += more.rendered[4:]  # appended turns, as the renderer adds them
    state.turns = more.turns
    again = state.to_bytes()
    assert state._history is history  # continued, not started over
    assert SessionState.from_bytes(first) == state_with_tool_turns(4)
    assert SessionState.from_bytes(again) == more
    assert json.loads(zlib.decompress(again)) == json.loads(zlib.decompress(more.to_bytes()))


def test_a_state_whose_history_was_replaced_is_encoded_afresh() -> None:
    state = state_with_tool_turns(4)
    state.to_bytes()
    other = state_with_tool_turns(3)
    state.rendered = other.rendered  # same length-prefix, other turns: a restarted session
    state.turns = other.turns
    assert SessionState.from_bytes(state.to_bytes()) == other
