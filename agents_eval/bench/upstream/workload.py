"""The upstream benchmark's sessions: agent-like multi-turn chats, each turn a tool observation and a short
reply. Every session opens with its own tag, so no two sessions (and no two routing runs) share a prefix."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents_eval.harness.report import check_settings

ROUTINGS = ("affinity", "round_robin")  # in the order they run


@dataclass(frozen=True)
class UpstreamBenchSettings:
    model: str = "tiny"  # what each upstream agentserve serves, and the front's tokenizer
    replicas: int = 2
    sessions: int = 8
    turns: int = 6
    observation_lines: int = 12  # lines of tool output per turn
    max_tokens: int = 8
    seed: int = 0

    def validate(self) -> None:
        check_settings([(self.replicas >= 2, "--replicas must be at least 2: routing needs a choice"),
                        (self.sessions >= 1, "--sessions must be at least 1"),
                        (self.turns >= 2, "--turns must be at least 2: reuse shows from the second turn"),
                        (self.observation_lines >= 1, "--observation-lines must be at least 1"),
                        (self.max_tokens >= 1, "--max-tokens must be at least 1")])


def observation(rng: random.Random, lines: int) -> str:
    files = ("main.py", "utils.py", "README.md", "setup.cfg", "test_api.py", "Makefile")
    return "\n".join(f"{rng.choice(files)}:{rng.randint(1, 400)}: {rng.choice(('ok', 'warning', 'error'))} "
                     f"in step {rng.randint(1, 99)}" for _ in range(lines))


def session_turns(settings: UpstreamBenchSettings, routing: str, index: int) -> list[str]:
    """The user/tool texts of one session's turns, seeded per routing run and session."""
    rng = random.Random(f"{settings.seed}-{routing}-{index}")
    tag = f"Session {routing}-{index}-{rng.randrange(10**9)}. Fix the failing build; the tool output follows.\n"
    return [tag + observation(rng, settings.observation_lines)] + [
        observation(rng, settings.observation_lines) for _ in range(settings.turns - 1)]
