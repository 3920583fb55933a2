"""One request's token state as the scheduler sees it (no torch here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from engine.core.sampling.sampler import SamplingParams
from engine.model.mask import MaskedSpan, QuerySelection


@dataclass(frozen=True)
class SessionRef:
    """The agent session a request is a turn of: its KV stays pinned for ttl_s after the turn."""

    key: str
    ttl_s: float
    vip: bool = False


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int | None = None  # prefix-cache hit at first scheduling
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    arrival_time: float = field(default_factory=time.monotonic)
    masked_spans: tuple[MaskedSpan, ...] = ()  # the caller's: history its attention skips
    selection: QuerySelection | None = None  # the `query` policy: the engine picks the history blocks decode reads
    selected_spans: tuple[MaskedSpan, ...] = ()  # the blocks the engine's selections skipped, the last ones open
    session: SessionRef | None = None
    prefill_only: bool = False  # a prefill worker's request: ends "prefilled" after its first token

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end], without joining prompt and outputs first (a decode step asks for one)."""
        prompt = len(self.prompt_token_ids)
        if start >= prompt:
            return self.output_token_ids[start - prompt:end - prompt]
        if end <= prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - prompt]

    @property
    def attention_spans(self) -> tuple[MaskedSpan, ...]:
        """Every span attention skips: the caller's, then the engine's selections."""
        return self.masked_spans + self.selected_spans if self.selected_spans else self.masked_spans

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def finish(self, reason: str) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
