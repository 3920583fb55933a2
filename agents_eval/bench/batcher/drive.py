"""Replay the workload on one `LLMEngine`: chat requests enter at their arrival step, each agent turn a tool
gap after its session's previous reply (on top of the history and reply, so its KV pin is adopted).
Per request: arrival, first token and last token, in engine steps and in wall seconds."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from agents_eval.bench.batcher.workload import CHAT, SLO_CLASSES, VIP_AGENT, AgentSession, Workload
from engine.core.llm_engine import LLMEngine
from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef

PIN_TTL_S = 600.0  # longer than the run: every tool gap ends with the pin still there
MAX_STEPS = 200_000


@dataclass
class RequestTiming:
    request_id: str
    kind: str
    session_id: str | None
    arrival_step: int
    arrival_s: float
    first_step: int = 0
    first_s: float = 0.0
    last_step: int = 0
    last_s: float = 0.0
    num_tokens: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_s - self.arrival_s

    @property
    def ttft_steps(self) -> int:
        return self.first_step - self.arrival_step + 1

    @property
    def tpot_s(self) -> float | None:
        return (self.last_s - self.first_s) / (self.num_tokens - 1) if self.num_tokens > 1 else None

    @property
    def tpot_steps(self) -> float | None:
        return (self.last_step - self.first_step) / (self.num_tokens - 1) if self.num_tokens > 1 else None


@dataclass
class _Session:
    spec: AgentSession
    history: list[int] = field(default_factory=list)
    turn: int = 0
    due_step: int | None = 0  # None while a turn runs

    @property
    def done(self) -> bool:
        return self.turn == len(self.spec.turns) and self.due_step is None


class Driver:
    def __init__(self, engine: LLMEngine, workload: Workload) -> None:
        self.engine = engine
        self.step = 0
        self.chats = deque(workload.chats)
        self.sessions = {s.session_id: _Session(s, due_step=s.turns[0].gap_steps) for s in workload.sessions}
        self.timings: dict[str, RequestTiming] = {}
        self.replies: dict[str, list[int]] = {}  # agent turns' tokens so far, for the next turn's history

    def run(self) -> list[RequestTiming]:
        while not self._done():
            if self.step >= MAX_STEPS:
                raise RuntimeError(f"the workload did not finish in {MAX_STEPS} steps")
            self._submit_due()
            outputs = self.engine.step() if self.engine.has_unfinished() else []
            now = time.perf_counter()
            for out in outputs:
                self._record(out, now)
            self.step += 1
        return list(self.timings.values())

    def _done(self) -> bool:
        return not self.chats and not self.engine.has_unfinished() and all(s.done for s in self.sessions.values())

    def _submit_due(self) -> None:
        while self.chats and self.chats[0].arrival_step <= self.step:
            chat = self.chats.popleft()
            self._submit(chat.request_id, CHAT, None, chat.prompt, chat.max_tokens)
        for session in self.sessions.values():
            if session.due_step is not None and session.due_step <= self.step:
                self._submit_turn(session)

    def _submit_turn(self, session: _Session) -> None:
        turn = session.spec.turns[session.turn]
        session.history += turn.new_tokens
        request_id = f"{session.spec.session_id}-turn-{session.turn}"
        ref = SessionRef(session.spec.session_id, PIN_TTL_S, vip=session.spec.kind == VIP_AGENT)
        self._submit(request_id, session.spec.kind, ref, list(session.history), turn.max_tokens)
        session.turn += 1
        session.due_step = None

    def _submit(self, request_id: str, kind: str, session: SessionRef | None, prompt: list[int],
                max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, slo_class=SLO_CLASSES[kind])
        self.timings[request_id] = RequestTiming(request_id, kind, session.key if session else None, self.step,
                                                 time.perf_counter())
        self.engine.add_request(prompt, params, request_id, session=session)

    def _record(self, out: RequestOutput, now: float) -> None:
        timing = self.timings[out.request_id]
        if out.new_token_ids and timing.num_tokens == 0:
            timing.first_step, timing.first_s = self.step, now
        timing.num_tokens += len(out.new_token_ids)
        timing.last_step, timing.last_s = self.step, now
        if timing.session_id is not None:
            self.replies.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                self._turn_finished(self.sessions[timing.session_id], self.replies.pop(out.request_id))

    def _turn_finished(self, session: _Session, reply: list[int]) -> None:
        session.history += reply
        if session.turn < len(session.spec.turns):
            session.due_step = self.step + session.spec.turns[session.turn].gap_steps
