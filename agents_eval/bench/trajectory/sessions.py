"""Synthetic SWE-agent-like sessions through `Trajectory` and the real engine.

Every session starts from one system prompt (shared by all, as an agent framework's is) and its own task;
each later turn appends one tool observation sized so that all turns fit the model's context, and the
engine generates a short reply (its length drawn per turn). All sessions run a turn concurrently, each
pinning its KV for its next turn. Per turn we record the whole prompt (what full recompute prefills)
and `num_prompt_tokens - num_cached_tokens` (what turn-delta reuse prefilled). `replay_recorded` runs the
recorded requests again without a session, on an engine with prefix caching off or on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from agents_eval.bench.trajectory.synthetic_outputs import KIND_TOOLS, ObservationKind, observation
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.mask import MaskedSpan
from engine.model.tokenizer import Tokenizer
from trajectory.agent import Policies, Trajectory, TurnPlan
from trajectory.template.types import ChatTemplate, Message

Advance = Callable[[int], None]

SYSTEM_PROMPT = (
    "You are an autonomous software engineer in a Linux shell, working on a Python repository. "
    "Each turn, answer with one tool call: shell to run a command, edit to change a file, submit when done. "
    "Read the tool output before acting and keep replies short.")
TASKS = (
    "Fix the KeyError raised by the session cache when a worker restarts.",
    "The parser drops the last line of a file without a trailing newline; fix it and add a test.",
    "Make the CLI exit with status 2 on a bad config path instead of a traceback.",
    "Tests in test_server.py fail on Python 3.12; find out why and fix them.",
)
OBSERVATION_MIX: tuple[ObservationKind, ...] = ("shell", "shell", "shell", "log", "log", "json")
REPLY_TOKENS = (8, 30)
OBSERVATION_JITTER = (0.6, 1.4)  # an observation's size relative to its fair share of the context left
MIN_OBSERVATION_TOKENS = 8
CONTEXT_MARGIN = 16  # tokens kept free for tokenisation at message boundaries
TURN_PERIOD_S = 2.0  # simulated time between a session's turns
REPLY_AFTER_S = 0.5


@dataclass(frozen=True)
class TurnResult:
    prompt_tokens: int  # the whole prompt: what full recompute prefills
    computed_tokens: int  # num_prompt_tokens - num_cached_tokens: what turn-delta reuse prefilled
    observation_tokens: tuple[int, int] | None = None  # before and after pruning; None on the first turn


@dataclass(frozen=True)
class RecordedRequest:
    prompt: list[int]
    masked_spans: list[MaskedSpan]
    max_tokens: int  # the reply's length


@dataclass
class SessionRun:
    session_id: str
    turns: list[TurnResult] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)  # one per turn run, for the replays
    final_tokens: int = 0  # tokens in the session's history after its last reply
    cut_short: bool = False  # a turn would not have fit the context


@dataclass(frozen=True)
class SessionWorkload:
    sessions: int
    turns: int
    seed: int
    template: ChatTemplate
    tokenizer: Tokenizer
    policies: Policies
    context_tokens: int  # a session's history stays within this and the model's context

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def turn_overhead(self) -> int:
        """Tokens a turn adds besides its observation and reply text: message wrappers and headers."""
        tool = self.template.render([Message("tool", "", name="shell")], add_generation_prompt=True)
        reply = self.template.render([Message("assistant", "")])
        return self.count_tokens(tool) + self.count_tokens(reply)


class _Session:
    def __init__(self, index: int, workload: SessionWorkload, max_model_len: int) -> None:
        self.workload = workload
        self.max_model_len = max_model_len
        self.rng = random.Random(f"{workload.seed}:session:{index}")
        self.replies = [self.rng.randint(*REPLY_TOKENS) for _ in range(workload.turns)]
        self.trajectory = Trajectory.start(f"swe-{index}", workload.template, workload.tokenizer,
                                           policies=workload.policies)
        self.run = SessionRun(self.trajectory.state.session_id)
        self.overhead = workload.turn_overhead()
        self.observation: tuple[int, int] | None = None

    def plan(self, turn: int) -> TurnPlan | None:
        """The turn's plan, or None (and the session ends) when it would not fit the context."""
        plan = self.trajectory.add_messages(self._messages(turn), now=turn * TURN_PERIOD_S)
        if plan.pruning:
            self.observation = (plan.pruning[0].tokens_before, plan.pruning[0].tokens_after)
        if len(plan.prompt_token_ids) + self.replies[turn] >= self.max_model_len:
            self.run.cut_short = True
            return None
        self.run.requests.append(RecordedRequest(plan.prompt_token_ids, plan.masked_spans, self.replies[turn]))
        return plan

    def params(self, turn: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=self.replies[turn], ignore_eos=True)

    def record(self, turn: int, completion: Completion) -> None:
        computed = completion.num_prompt_tokens - completion.num_cached_tokens
        self.run.turns.append(TurnResult(completion.num_prompt_tokens, computed, self.observation))
        self.trajectory.record_reply(completion.token_ids, now=turn * TURN_PERIOD_S + REPLY_AFTER_S)
        self.run.final_tokens = self.trajectory.state.num_tokens

    def _messages(self, turn: int) -> list[Message]:
        if turn == 0:
            return [Message("system", SYSTEM_PROMPT), Message("user", self.rng.choice(TASKS))]
        kind = self.rng.choice(OBSERVATION_MIX)
        text = observation(kind, self.rng, self._observation_budget(turn), self.workload.count_tokens)
        return [Message("tool", text, name=KIND_TOOLS[kind])]

    def _observation_budget(self, turn: int) -> int:
        """A jittered fair share of the context the remaining turns leave for observations."""
        reserved = sum(self.replies[turn:]) + (self.workload.turns - turn) * self.overhead + CONTEXT_MARGIN
        room = self.max_model_len - 1 - self.trajectory.state.num_tokens - reserved
        share = room / (self.workload.turns - turn) * self.rng.uniform(*OBSERVATION_JITTER)
        return max(MIN_OBSERVATION_TOKENS, min(room, int(share)))


def drain(engine: LLMEngine) -> dict[str, Completion]:
    """Step the engine until every request finished; completions by request id."""
    results: dict[str, Completion] = {}
    while engine.has_unfinished():
        for out in engine.step():
            results.setdefault(out.request_id, Completion(out.request_id)).add(out)
    return results


def run_sessions(engine: LLMEngine, workload: SessionWorkload, advance: Advance) -> list[SessionRun]:
    """Every session turn by turn, all sessions' turn k running concurrently in the engine."""
    context = min(engine.max_model_len, workload.context_tokens)
    sessions = [_Session(index, workload, context) for index in range(workload.sessions)]
    for turn in range(workload.turns):
        live = [session for session in sessions if not session.run.cut_short]
        submitted = {}
        for session in live:
            plan = session.plan(turn)
            if plan is not None:
                request_id = engine.add_request(plan.prompt_token_ids, session.params(turn),
                                                masked_spans=plan.masked_spans, session=plan.session)
                submitted[request_id] = session
        for request_id, completion in drain(engine).items():
            submitted[request_id].record(turn, completion)
        advance(len(live))
    return [session.run for session in sessions]


def replay_recorded(engine: LLMEngine, runs: list[SessionRun], advance: Advance) -> list[int]:
    """Every recorded request again, without a session (no pin), grouped as recorded: all sessions' turn k at
    once, each generating its reply's length so its KV is in the prefix cache as the pinned run's was. The
    prefill tokens the engine computed, per turn index (all of them when prefix caching is off)."""
    turns = max(len(run.requests) for run in runs)
    computed = [0] * turns
    for turn in range(turns):
        requests = [run.requests[turn] for run in runs if turn < len(run.requests)]
        for request in requests:
            params = SamplingParams(temperature=0, max_tokens=request.max_tokens, ignore_eos=True)
            engine.add_request(request.prompt, params, masked_spans=request.masked_spans)
        computed[turn] = sum(c.num_prompt_tokens - c.num_cached_tokens for c in drain(engine).values())
        advance(len(requests))
    return computed
