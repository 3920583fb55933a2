"""One agent session turned into the least work for the engine.

Each turn: prune new observations once (history stays append-only; `trajectory.observations` says which
messages are observations), render the new messages incrementally into token ids, mask observations that
fell out of the last K, classify the turn
think or act, and hand the engine the whole history with the session's KV pin; the engine then computes
only the tokens the pinned KV lacks (the turn delta). The reply is recorded with the engine's own ids.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine import MaskedSpan, QuerySelection, SessionRef, Tokenizer
from trajectory import step_timer
from trajectory.masks import query_selection, update_masks
from trajectory.observations import ObservationUsers, is_observation
from trajectory.phase.classifier import PhaseConfig, PhaseEstimate, TurnFeatures, classify_turn
from trajectory.pruning.prune import OBSERVATION_ROLE, PruneResult, PruningConfig, prune
from trajectory.session import SessionState, TurnRecord
from trajectory.settings import TrajectorySettings
from trajectory.template.incremental import IncrementalRenderer
from trajectory.template.types import ChatTemplate, Message, ToolSchemas
from trajectory.ttl import observe_turn_arrival, pin_ttl


@dataclass
class TurnPlan:
    """What the engine gets for one turn."""

    prompt_token_ids: list[int]  # the whole history, the new messages and the assistant header
    masked_spans: list[MaskedSpan]
    session: SessionRef
    phase: PhaseEstimate
    new_tokens: int  # tokens this turn appended to the history (new messages + header)
    pruning: list[PruneResult] = field(default_factory=list)
    selection: QuerySelection | None = None  # the `query` history policy: the engine picks the blocks read


@dataclass
class Policies:
    settings: TrajectorySettings
    pruning: PruningConfig
    phase: PhaseConfig

    @classmethod
    def load(cls) -> Policies:
        return cls(TrajectorySettings(), PruningConfig.load(), PhaseConfig.load())


class Trajectory:
    def __init__(self, state: SessionState, renderer: IncrementalRenderer, policies: Policies,
                 vip: bool = False) -> None:
        self.state = state
        self.renderer = renderer
        self.policies = policies
        self.vip = vip

    @classmethod
    def start(cls, session_id: str, template: ChatTemplate, tokenizer: Tokenizer,
              tools: ToolSchemas | None = None, policies: Policies | None = None) -> Trajectory:
        renderer = IncrementalRenderer(template, tokenizer, tools)
        return cls(SessionState(session_id), renderer, policies or Policies.load())

    @classmethod
    def restore(cls, data: bytes, template: ChatTemplate, tokenizer: Tokenizer,
                tools: ToolSchemas | None = None, policies: Policies | None = None) -> Trajectory:
        state = SessionState.from_bytes(data)
        renderer = IncrementalRenderer.restore(template, tokenizer, tools, state.rendered, state.prefix_stable)
        return cls(state, renderer, policies or Policies.load())

    def to_bytes(self) -> bytes:
        return self.state.to_bytes()

    def add_messages(self, messages: Sequence[Message], now: float | None = None,
                     observation_users: ObservationUsers | None = None, history_policy: str | None = None
                     ) -> TurnPlan:
        """The plan for a turn adding `messages`; `observation_users` overrides the rule in the pruning config,
        `history_policy` the deployment's default one (`history` in configs/trajectory.yaml; ValueError when the
        deployment does not offer it)."""
        history = self.policies.settings.history
        policy = history_policy or history.default
        if policy not in history.policies:
            raise ValueError(f"history policy {policy!r} is not offered here; offered: {history.policies}")
        step_timer.enter("plan")
        now = time.time() if now is None else now
        observe_turn_arrival(self.state, now, self.policies.settings.ttl)
        start = self.renderer.num_tokens
        rule = observation_users or self.policies.pruning.observation_users
        pruning = [self._append(message, now, rule) for message in messages]
        self._sync()
        masks = self.policies.settings.masks
        selection = None if policy == "age" else query_selection(
            self.state, history, masks.sink_tokens, "attention" if policy == "attention" else "query")
        if selection is None:  # under `query` and `attention` earlier `age` turns' masks stay, no new one added
            update_masks(self.state, masks)
        header = self.renderer.generation_prompt_ids()
        phase = self._classify(messages, self.renderer.num_tokens - start + len(header))
        for turn in self.state.turns[len(self.state.turns) - len(messages):]:
            turn.phase, turn.confidence = phase.phase.value, phase.confidence
        plan = TurnPlan(self.renderer.ids_then(header), list(self.state.masked_spans), self._session_ref(now),
                        phase, self.renderer.num_tokens - start + len(header), [p for p in pruning if p], selection)
        step_timer.leave("plan")
        return plan

    def record_reply(self, generated_ids: Sequence[int], message: Message | None = None,
                     now: float | None = None) -> list[int]:
        """Record the generated reply; returns the ids the history now holds for it."""
        start = self.renderer.num_tokens
        ids = self.renderer.assistant_turn_ids(generated_ids, message)
        self._sync()
        reply = self.renderer.turns[-1].message
        self.state.turns.append(TurnRecord("assistant", start, self.renderer.num_tokens, at=now or time.time()))
        self.state.pending_tools = [call.get("function", {}).get("name", "") for call in reply.tool_calls or []]
        self.state.reply_finished_at = time.time() if now is None else now
        return ids

    def tool_call_started(self, name: str, estimated_s: float | None = None, now: float | None = None) -> None:
        self.state.announced_tool = (name, time.time() if now is None else now, estimated_s)

    def tool_call_finished(self, now: float | None = None) -> None:
        self.state.announced_tool = None

    def pin_ttl(self, now: float | None = None) -> float:
        """How long the engine should keep this session's KV pinned from now: call after record_reply and
        after a tool call is announced, and pass it to the engine (`LLMEngine.set_session_ttl`)."""
        return pin_ttl(self.state, time.time() if now is None else now, self.policies.settings.ttl)

    def _append(self, message: Message, now: float, rule: ObservationUsers) -> PruneResult | None:
        after_assistant = any(turn.role == "assistant" for turn in self.state.turns)
        observation = is_observation(message, after_assistant, rule)
        result = None
        if self.policies.settings.prune and observation:
            result = prune(message.content, OBSERVATION_ROLE, self._tool_name(message), self.policies.pruning,
                           lambda text: len(self.renderer.tokenizer.encode(text)))
            message = Message(message.role, result.text, message.tool_calls, message.tool_call_id, message.name)
        start = self.renderer.num_tokens
        self.renderer.append(message)
        self._sync()
        self.state.turns.append(TurnRecord(message.role, start, self.renderer.num_tokens, self._tool_name(message),
                                           observation, result.tokens_before if result else None, at=now))
        return result

    def _tool_name(self, message: Message) -> str | None:
        if message.role != "tool":
            return None
        if message.name:
            return message.name
        for turn in reversed(self.renderer.turns):
            for call in turn.message.tool_calls or []:
                if call.get("id") == message.tool_call_id:
                    return str(call.get("function", {}).get("name"))
        return None

    def _classify(self, messages: Sequence[Message], delta_tokens: int) -> PhaseEstimate:
        previous = [t.message for t in self.renderer.turns[: len(self.renderer.turns) - len(messages)]]
        last_reply = next((m for m in reversed(previous) if m.role == "assistant"), None)
        features = TurnFeatures(delta_tokens, self.state.output_lengths[-4:],
                                bool(last_reply and last_reply.tool_calls),
                                tuple(m.role for m in messages), bool(self.renderer.tools))
        return classify_turn(features, self.policies.phase)

    def _session_ref(self, now: float) -> SessionRef:
        return SessionRef(self.state.session_id, self.pin_ttl(now), self.vip)

    def _sync(self) -> None:
        self.state.rendered = list(self.renderer.turns)
        self.state.prefix_stable = self.renderer.prefix_stable
