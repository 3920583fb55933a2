"""The mixed workload: long-context agent sessions (turn after turn, each appending a tool observation to its
history, with a tool gap between turns) and short chat requests arriving open-loop, Poisson in engine steps.

Arrivals are counted in engine steps, not seconds, so both policies are offered the very same load however
fast the (shared, loaded) machine runs. Token ids are drawn at random: the model's weights are random too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agents_eval.harness.report import check_settings

CHAT, AGENT, VIP_AGENT = "chat", "agent", "vip agent"
KINDS = (CHAT, AGENT, VIP_AGENT)
SLO_CLASSES = {CHAT: "interactive", AGENT: "normal", VIP_AGENT: "vip"}  # classes of configs/slo.yaml
FIRST_TOKEN_ID = 3  # past bos/eos


@dataclass(frozen=True)
class BatcherBenchSettings:
    model: str = "tiny"
    chat_requests: int = 200
    chat_gap_steps: float = 4.0  # mean steps between chat arrivals
    chat_prompt_tokens: tuple[int, int] = (16, 96)
    chat_output_tokens: tuple[int, int] = (16, 48)
    sessions: int = 8  # agent sessions; the first is VIP
    turns: int = 6
    first_turn_tokens: int = 512  # system prompt, task and repository context
    observation_tokens: tuple[int, int] = (96, 224)
    agent_output_tokens: tuple[int, int] = (16, 32)
    tool_gap_steps: tuple[int, int] = (2, 8)
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 128
    slo_scale: float = 0.1  # SLO targets of configs/slo.yaml times this: a CPU test model is fast
    seed: int = 0
    num_threads: int = 1

    def validate(self) -> None:
        check_settings([
            (self.chat_requests >= 1 and self.chat_gap_steps > 0, "--chat-requests and --chat-gap must be positive"),
            (self.sessions >= 1 and self.turns >= 1, "--sessions and --turns must be at least 1"),
            (self.max_num_seqs >= 1 and self.max_num_batched_tokens >= 1, "the engine needs slots and budget"),
            (self.num_threads >= 1, "--threads must be at least 1"),
            (self.slo_scale > 0, "--slo-scale must be positive"),
        ])

    def max_context(self) -> int:
        """Tokens of an agent session's last turn at the longest: it must fit the model's context."""
        per_turn = self.observation_tokens[1] + self.agent_output_tokens[1]
        return self.first_turn_tokens + per_turn * (self.turns - 1) + self.agent_output_tokens[1]


@dataclass(frozen=True)
class ChatRequest:
    request_id: str
    arrival_step: int
    prompt: list[int]
    max_tokens: int


@dataclass(frozen=True)
class AgentTurn:
    """One turn's new tokens (the first turn's whole prompt, later an observation) and reply length."""

    new_tokens: list[int]
    max_tokens: int
    gap_steps: int  # tool time before this turn arrives, after the previous reply


@dataclass(frozen=True)
class AgentSession:
    session_id: str
    kind: str  # AGENT or VIP_AGENT
    turns: list[AgentTurn]


@dataclass(frozen=True)
class BatcherWorkload:
    chats: list[ChatRequest]
    sessions: list[AgentSession]

    @property
    def num_requests(self) -> int:
        return len(self.chats) + sum(len(s.turns) for s in self.sessions)


def _tokens(rng: random.Random, count: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(count)]


def _chats(settings: BatcherBenchSettings, rng: random.Random, vocab_size: int) -> list[ChatRequest]:
    chats, clock = [], 0.0
    for index in range(settings.chat_requests):
        clock += rng.expovariate(1.0 / settings.chat_gap_steps)
        prompt = _tokens(rng, rng.randint(*settings.chat_prompt_tokens), vocab_size)
        chats.append(ChatRequest(f"chat-{index}", int(clock), prompt, rng.randint(*settings.chat_output_tokens)))
    return chats


def _session(settings: BatcherBenchSettings, rng: random.Random, index: int, vocab_size: int) -> AgentSession:
    turns = [AgentTurn(_tokens(rng, settings.first_turn_tokens, vocab_size),
                       rng.randint(*settings.agent_output_tokens), rng.randint(0, settings.tool_gap_steps[1]))]
    for _ in range(settings.turns - 1):
        observation = _tokens(rng, rng.randint(*settings.observation_tokens), vocab_size)
        turns.append(AgentTurn(observation, rng.randint(*settings.agent_output_tokens),
                               rng.randint(*settings.tool_gap_steps)))
    return AgentSession(f"session-{index}", VIP_AGENT if index == 0 else AGENT, turns)


def build_workload(settings: BatcherBenchSettings, vocab_size: int, max_model_len: int) -> BatcherWorkload:
    if settings.max_context() >= max_model_len:
        raise ValueError(f"an agent session can reach {settings.max_context()} tokens; the model's context is "
                         f"{max_model_len}: lower --turns or the token ranges")
    rng = random.Random(settings.seed)
    chats = _chats(settings, rng, vocab_size)
    return BatcherWorkload(chats, [_session(settings, rng, i, vocab_size) for i in range(settings.sessions)])
