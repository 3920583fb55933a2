"""What the gateway keeps of a model when upstreams serve it: its tokenizer and chat template (for sessions,
pruning and turn accounting) and its context length (for request checks), without its weights. It stands
where the embedded engine stands and runs nothing: generation goes upstream (`UpstreamEngine`). Over vLLM
`kv_both` instances it holds the capacity controller that splits them between prefill and decode."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine import (
    AgentSignals,
    EngineStats,
    MaskedSpan,
    Prompt,
    QuerySelection,
    RequestOutput,
    RequestValidator,
    SamplingParams,
    SessionRef,
    WorkerReport,
    load_slo_config,
    load_tokenizer_or_none,
    resolve_model,
)

if TYPE_CHECKING:
    from gateway.upstream.capacity import UpstreamCapacity

UNBOUNDED_BLOCKS = 1 << 30  # the upstream owns the KV cache: no local block limit applies


class TokenizerFront:
    capacity: UpstreamCapacity | None = None  # set by UpstreamEngine over vLLM kv_both instances
    steps_when_idle = False

    def __init__(self, model: str) -> None:
        source = resolve_model(model)
        self.checkpoint = source.checkpoint
        self.tokenizer = load_tokenizer_or_none(source.checkpoint)
        self.max_model_len = source.config.max_position_embeddings
        slo_classes = frozenset(load_slo_config().classes)
        self.validator = RequestValidator(source.config, self.tokenizer, 1, UNBOUNDED_BLOCKS, slo_classes)

    def tokenize(self, prompt: Prompt) -> list[int]:
        return self.validator.tokenize(prompt)

    def validate(self, prompt: Prompt, params: SamplingParams) -> list[int]:
        return self.validator.validate(prompt, params)

    def add_request(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, *,
                    masked_spans: Sequence[MaskedSpan] = (), session: SessionRef | None = None,
                    selection: QuerySelection | None = None) -> str:
        raise ValueError("requests go to the upstreams")

    def abort(self, request_id: str) -> None:
        return None

    def has_unfinished(self) -> bool:
        return False

    def step(self) -> list[RequestOutput]:
        return []

    def wakeup(self) -> None:
        return None

    def set_session_ttl(self, key: str, ttl_s: float) -> bool:
        return False  # the upstream's prefix cache keeps what it keeps

    def stats(self) -> EngineStats:
        return EngineStats() if self.capacity is None else self.capacity.stats()

    def worker_reports(self) -> list[WorkerReport]:
        return []  # the upstreams report their own load

    def kv_tier_stats(self) -> None:
        return None  # the upstreams' KV tiers are theirs

    def update_signals(self, signals: AgentSignals) -> None:
        if self.capacity is not None:
            self.capacity.update_signals(signals, time.monotonic())

    def shutdown(self, deadline_s: float = 10.0) -> None:
        return None
