"""Which messages are observations: the only messages pruning and sparse history masks act on.

- a `tool` message (chat function calling; the gateway turns a Responses `function_call_output` into one);
- a `user` message, under the rule `observation_users` (`configs/pruning.yaml`, or per request
  `metadata.observation_users`): `after_assistant` counts a user message as an observation once the session
  holds an assistant message (SWE-agent and WebArena send tool output as user turns); `never` counts none.

The system prompt is never an observation, nor is any user message before the session's first assistant
message: that is the instruction.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

from trajectory.template.types import Message

ObservationUsers = Literal["after_assistant", "never"]
OBSERVATION_USERS: tuple[str, ...] = get_args(ObservationUsers)


def observation_users(value: str) -> ObservationUsers:
    """`value` as a rule; ValueError names the rules when it is none of them."""
    if value in OBSERVATION_USERS:
        return cast(ObservationUsers, value)
    raise ValueError(f"observation_users must be one of {OBSERVATION_USERS}, not {value!r}")


def is_observation(message: Message, after_assistant: bool, rule: ObservationUsers) -> bool:
    """Whether `message` is an observation; `after_assistant`: the session already holds an assistant message."""
    if message.role == "tool":
        return True
    return message.role == "user" and rule == "after_assistant" and after_assistant
