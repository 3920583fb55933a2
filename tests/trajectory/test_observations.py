"""Observations (tool messages, user messages under `observation_users`) are what pruning and masks act on;
the system prompt and the instruction never are."""

from __future__ import annotations

import pytest

from engine.model.loader import load_tokenizer
from trajectory.agent import Policies, Trajectory
from trajectory.observations import is_observation, observation_users
from trajectory.pruning.prune import PruningConfig
from trajectory.session import SessionState
from trajectory.template.default import DefaultChatTemplate
from trajectory.template.types import Message, Role

NOISY = "\n".join(["[12] link 'Home'     ........"] * 12 + ["[13] button 'Add to cart'"])
SYSTEM = "You are an agent.     Answer.......... now"
INSTRUCTION = "Buy the the the cheapest mouse.\n" * 3


def start(session_id: str, rule: str = "after_assistant") -> Trajectory:
    policies = Policies.load()
    policies.pruning = policies.pruning.model_copy(update={"observation_users": rule})
    return Trajectory.start(session_id, DefaultChatTemplate(), load_tokenizer(None), policies=policies)


def play(trajectory: Trajectory, observations: list[Message]) -> list[int]:
    """The instruction, then one observation per reply; per turn, the tokens pruning removed."""
    plan = trajectory.add_messages([Message("system", SYSTEM), Message("user", INSTRUCTION)], now=0.0)
    removed = [sum(p.tokens_before - p.tokens_after for p in plan.pruning)]
    for step, message in enumerate(observations, start=1):
        trajectory.record_reply([100 + step, 101], now=step - 0.5)
        plan = trajectory.add_messages([message], now=float(step))
        removed.append(sum(p.tokens_before - p.tokens_after for p in plan.pruning))
    return removed


def masked_roles(trajectory: Trajectory) -> list[str]:
    state = trajectory.state
    starts = {span.start for span in state.masked_spans}
    return [turn.role for turn in state.turns if max(turn.token_start, 4) in starts]


@pytest.mark.parametrize("role", ["tool", "user"])
def test_observations_are_pruned_and_old_ones_masked(role: Role) -> None:
    trajectory = start(f"obs-{role}")
    removed = play(trajectory, [Message(role, NOISY, tool_call_id="c" if role == "tool" else None)] * 4)
    assert removed[0] == 0 and all(count > 0 for count in removed[1:])
    assert [t.observation for t in trajectory.state.turns if t.role != "assistant"] == [False, False] + [True] * 4
    assert masked_roles(trajectory) == [role, role]  # four observations, the last two kept
    assert "Add to cart" in trajectory.renderer.turns[-1].text


def test_system_and_instruction_stay_byte_identical_and_unmasked() -> None:
    trajectory = start("instruction")
    play(trajectory, [Message("user", NOISY)] * 4)
    assert [t.message.content for t in trajectory.renderer.turns[:2]] == [SYSTEM, INSTRUCTION]
    first, second = trajectory.state.turns[:2]
    assert not first.observation and not second.observation
    assert all(span.start >= second.token_end for span in trajectory.state.masked_spans)


def test_rule_never_keeps_user_messages_whole() -> None:
    trajectory = start("never")
    trajectory.add_messages([Message("user", INSTRUCTION)], now=0.0)
    trajectory.record_reply([100], now=0.5)
    plan = trajectory.add_messages([Message("user", NOISY)], now=1.0, observation_users="never")
    assert plan.pruning == [] and not trajectory.state.turns[-1].observation
    config = PruningConfig.model_validate({"observation_users": "never"})
    trajectory = Trajectory.start("never-config", DefaultChatTemplate(), load_tokenizer(None),
                                  policies=Policies(Policies.load().settings, config, Policies.load().phase))
    assert play(trajectory, [Message("user", NOISY)] * 2) == [0, 0, 0]


def test_a_session_restarted_on_a_reply_counts_the_user_message_after_it() -> None:
    trajectory = start("last-action")
    plan = trajectory.add_messages([Message("system", SYSTEM), Message("assistant", "click [12]"),
                                    Message("user", NOISY)], now=0.0)
    assert [t.observation for t in trajectory.state.turns] == [False, False, True]
    assert plan.pruning and plan.pruning[0].tokens_after < plan.pruning[0].tokens_before


def test_observations_survive_serialisation_and_keep_masking() -> None:
    trajectory = start("restore")
    play(trajectory, [Message("user", NOISY)] * 2)
    restored = Trajectory.restore(trajectory.to_bytes(), DefaultChatTemplate(), load_tokenizer(None),
                                  policies=trajectory.policies)
    assert SessionState.from_bytes(trajectory.to_bytes()).turns == trajectory.state.turns
    assert masked_roles(restored) == []
    restored.record_reply([200], now=3.5)
    restored.add_messages([Message("user", NOISY)], now=4.0)
    assert masked_roles(restored) == ["user"]


def test_is_observation_rule() -> None:
    assert is_observation(Message("tool", "x"), after_assistant=False, rule="never")
    assert is_observation(Message("user", "x"), after_assistant=True, rule="after_assistant")
    assert not is_observation(Message("user", "x"), after_assistant=False, rule="after_assistant")
    assert not is_observation(Message("system", "x"), after_assistant=True, rule="after_assistant")
    assert not is_observation(Message("assistant", "x"), after_assistant=True, rule="after_assistant")
    with pytest.raises(ValueError, match="observation_users must be one of"):
        observation_users("sometimes")
