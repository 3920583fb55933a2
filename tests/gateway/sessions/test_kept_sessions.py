"""Sessions kept live between turns: a turn continues the trajectory this process saved last only while the
store still holds what it saved; otherwise (another replica's turn, an expired or replaced entry) it decodes
the store's bytes. The kept map is bounded by the session TTL and a capacity."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.loader import load_tokenizer
from gateway.sessions.manager import KeptSessions, SessionManager, message_digest
from gateway.sessions.store import MemorySessionStore, session_key
from trajectory.agent import Policies, Trajectory
from trajectory.session import SessionState
from trajectory.template.default import DefaultChatTemplate
from trajectory.template.types import ROLES, Message

KEY = session_key("alice", "s1")
TOOLS = [{"type": "function", "function": {"name": "shell"}}]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def policies() -> Policies:
    return Policies.load()


def manager(policies: Policies) -> SessionManager:
    return SessionManager(MemorySessionStore(), DefaultChatTemplate(), load_tokenizer(None), policies, ttl_s=60)


async def one_turn(sessions: SessionManager, text: str) -> Trajectory:
    async with sessions.open(KEY) as turn:
        turn.trajectory.add_messages([Message("user", text)])
        turn.trajectory.record_reply([5, 6, 7])
        return turn.trajectory


async def test_the_next_turn_continues_the_trajectory_saved_last(policies: Policies) -> None:
    sessions = manager(policies)
    first = await one_turn(sessions, "list the files")
    second = await one_turn(sessions, "open the first one")
    assert second is first
    stored = await sessions.store.get(KEY)
    assert stored is not None and SessionState.from_bytes(stored) == second.state
    assert len(second.state.turns) == 4


async def test_a_turn_decodes_the_store_when_it_holds_other_bytes(policies: Policies) -> None:
    sessions, elsewhere = manager(policies), manager(policies)
    kept = await one_turn(sessions, "list the files")
    elsewhere.store = sessions.store  # another replica, same store
    other = await one_turn(elsewhere, "open the first one")
    continued = await one_turn(sessions, "and the second")
    assert continued is not kept and continued is not other
    assert [t.role for t in continued.state.turns] == ["user", "assistant"] * 3


async def test_a_rolled_back_turn_is_the_stored_session(policies: Policies) -> None:
    sessions = manager(policies)
    await one_turn(sessions, "list the files")
    async with sessions.open(KEY) as turn:
        before = SessionState.from_bytes(turn.loaded or b"")
        turn.trajectory.add_messages([Message("user", "this turn fails")])
        sessions.roll_back(turn, None)
        assert turn.trajectory.state == before
    async with sessions.open(session_key("alice", "new")) as turn:
        turn.trajectory.add_messages([Message("user", "first turn fails")])
        sessions.roll_back(turn, None)
        assert turn.trajectory.state.turns == [] and turn.trajectory.state.session_id == turn.key.path


def test_kept_trajectories_go_once_taken_with_other_tools_past_the_ttl_or_over_capacity(policies: Policies) -> None:
    clock = Clock()
    kept = KeptSessions(ttl_s=10, capacity=2, clock=clock)
    trajectory = Trajectory.start("s", DefaultChatTemplate(), load_tokenizer(None), TOOLS, policies)
    kept.keep(KEY, b"saved", trajectory)
    assert kept.take(KEY, b"other", TOOLS) is None and kept.take(KEY, b"saved", TOOLS) is None  # taken: gone
    kept.keep(KEY, b"saved", trajectory)
    assert kept.take(KEY, b"saved", None) is None  # the tools offered changed
    kept.keep(KEY, b"saved", trajectory)
    assert kept.take(KEY, b"saved", TOOLS) is trajectory
    for index in range(3):
        kept.keep(session_key("alice", f"s{index + 2}"), b"x", trajectory)
    assert len(kept) == 2
    clock.now = 10.0
    kept.keep(session_key("bob", "late"), b"x", trajectory)
    assert len(kept) == 1


def reference_digest(message: Message) -> str:
    """The digest as sessions stored before it was spelled out: what a stored session's history holds."""
    calls = [{"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
             for c in message.tool_calls or []]
    payload = json.dumps([message.role, message.content, calls, message.tool_call_id], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


CALLS = st.none() | st.just([{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}])


@settings(max_examples=200, deadline=None)
@given(message=st.builds(Message, st.sampled_from(ROLES), st.text() | st.just("lone \ud800 é"), CALLS,
                        st.none() | st.text()))
def test_message_digests_are_the_ones_stored_sessions_hold(message: Message) -> None:
    assert message_digest(message) == reference_digest(message)
