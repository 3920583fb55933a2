"""The upstream benchmark's sessions: agent-like multi-turn chats, each turn a tool observation and a short
reply. Every session opens with its own tag, so no two sessions share a prefix. Every routing plays the same
texts (each on fresh replicas), so their prefill counts differ by routing alone; other runs (the failover's)
play their own."""

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


def session_turns(settings: UpstreamBenchSettings, run: str, index: int) -> list[str]:
    """The user/tool texts of one session's turns, seeded per session and run (every routing is one run)."""
    texts = "routings" if run in ROUTINGS else run
    rng = random.Random(f"{settings.seed}-{texts}-{index}")
    tag = f"Session {texts}-{index}-{rng.randrange(10**9)}. Fix the failing build; the tool output follows.\n"
    return [tag + observation(rng, settings.observation_lines)] + [
        observation(rng, settings.observation_lines) for _ in range(settings.turns - 1)]
