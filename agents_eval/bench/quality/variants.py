"""One transcript as the engine sees it under each variant of history handling.

- full: every observation as it came.
- pruned: observations pruned on ingest (`configs/pruning.yaml`).
- age (the masks of before, `configs/trajectory.yaml: masks`): observations older than the last K stay in the
  prompt but attention skips them.
- query, attention: the engine picks the history blocks the reply reads (`configs/trajectory.yaml: history`;
  the last turn's prefill picks per layer, decode every `refresh_steps` steps).
- pruned+age, pruned+query, pruned+attention: pruning on ingest, then the policy.
- dropped: text-level, as SWE-agent's and OpenHands' history processors do: observations older than the
  last K (the masks' K) replaced by a one-line placeholder.

Every variant drives `Trajectory` turn by turn, as a live session would, and reads the prompt, its masked
spans, its selection and the tool messages' token spans from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents_eval.bench.quality.transcripts import Transcript
from engine.model.mask import MaskedSpan, QuerySelection
from engine.model.tokenizer import Tokenizer
from trajectory.agent import Policies, Trajectory
from trajectory.template.types import ChatTemplate, Message

POLICIES = ("age", "query", "attention")
VARIANTS = ("full", "pruned", *(f"{prune}{policy}" for policy in POLICIES for prune in ("", "pruned+")), "dropped")
PLACEHOLDER = "Old environment output: ({lines} lines omitted)"


@dataclass(frozen=True)
class VariantPrompt:
    variant: str
    token_ids: list[int]
    masked_spans: list[MaskedSpan]
    observation_spans: list[tuple[int, int]]  # each tool message's tokens, template markers included
    selection: QuerySelection | None = None  # `query` and `attention`: the engine picks what the reply reads

    @property
    def observation_tokens(self) -> int:
        return sum(end - start for start, end in self.observation_spans)

    @property
    def attended_observation_tokens(self) -> int:
        """Observation tokens the answer's first token attends to: all of them less the masked ones (under
        `query` and `attention` less what the engine skipped as well: `picked_observation_tokens`)."""
        position = len(self.token_ids)
        masked = {i for span in self.masked_spans if span.from_position <= position
                  for i in range(span.start, span.end)}
        return sum(1 for start, end in self.observation_spans for i in range(start, end) if i not in masked)

    def picked_observation_tokens(self, history_end: int, read: set[int]) -> int:
        """Observation tokens read by a query that reads these positions of the history before `history_end`
        (one layer's picks) and every position from there on."""
        return sum(1 for start, end in self.observation_spans for i in range(start, end)
                   if i >= history_end or i in read)


def variant_policies(base: Policies, variant: str) -> Policies:
    """`base` with pruning and masks on or off as the variant wants; K and the rules stay as configured.
    Observations come as tool messages (function calling), so no user message is one: the closing question
    is the user's, neither pruned nor counted among the last K."""
    prune, mask = variant.startswith("pruned"), variant.endswith("age")
    masks = base.settings.masks.model_copy(update={"enabled": mask})
    settings = base.settings.model_copy(update={"prune": prune, "masks": masks})
    return Policies(settings, base.pruning.model_copy(update={"observation_users": "never"}), base.phase)


def drop_old_observations(groups: Sequence[Sequence[Message]], keep: int) -> list[list[Message]]:
    """Tool messages older than the last `keep` with their content replaced by the placeholder."""
    tools = [message for group in groups for message in group if message.role == "tool"]
    old = {id(message) for message in tools[:max(len(tools) - keep, 0)]}
    return [[_placeholder(message) if id(message) in old else message for message in group] for group in groups]


def _placeholder(message: Message) -> Message:
    text = PLACEHOLDER.format(lines=len(message.content.splitlines()))
    return Message("tool", text, message.tool_calls, message.tool_call_id, message.name)


def build_prompt(transcript: Transcript, variant: str, template: ChatTemplate, tokenizer: Tokenizer,
                 base: Policies) -> VariantPrompt:
    policies = variant_policies(base, variant)
    groups = transcript.message_groups()
    if variant == "dropped":
        groups = drop_old_observations(groups, base.settings.masks.keep_last_tool_observations)
    policy = next((p for p in POLICIES if variant.endswith(p)), "age")
    session = Trajectory.start(f"quality-{transcript.index}-{variant}", template, tokenizer, policies=policies)
    for turn, group in enumerate(groups[:-1]):
        session.add_messages(group, now=float(turn), history_policy=policy)
    plan = session.add_messages(groups[-1], now=float(len(groups)), history_policy=policy)
    spans = [(t.token_start, t.token_end) for t in session.state.turns if t.role == "tool"]
    return VariantPrompt(variant, plan.prompt_token_ids, plan.masked_spans, spans, plan.selection)
