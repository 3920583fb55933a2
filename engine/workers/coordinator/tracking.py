"""The coordinator's record of each request in flight and of the KV transfers it saw."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.model.mask import MaskedSpan, QuerySelection


@dataclass
class Tracked:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    masked_spans: tuple[MaskedSpan, ...] = ()
    session: SessionRef | None = None
    selection: QuerySelection | None = None
    worker_ids: set[int] = field(default_factory=set)
    output_ids: list[int] = field(default_factory=list)  # output tokens already given to the caller
    emitted_chars: int = 0
    skip: int = 0  # tokens a re-run regenerates that the caller already has
    skip_chars: int = 0
    attempt: int = 0
    submitted_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def attempt_id(self) -> str:
        return self.request_id if self.attempt == 0 else f"{self.request_id}#retry{self.attempt}"

    def relay(self, raw: RequestOutput) -> RequestOutput:
        """A worker's output as the caller sees it: under the request's own id, without what a re-run
        regenerates that the caller already has; a prefill worker's hand-off is not the end."""
        if raw.new_token_ids and self.first_token_at is None:
            self.first_token_at = time.monotonic()
        new_tokens = raw.new_token_ids[self.skip:]
        self.skip = max(0, self.skip - len(raw.new_token_ids))
        text = raw.new_text[self.skip_chars:]
        self.skip_chars = max(0, self.skip_chars - len(raw.new_text))
        self.output_ids += new_tokens
        self.emitted_chars += len(text)
        finished = raw.finished and raw.finish_reason != "prefilled"
        # built, not dataclasses.replace(d): this runs per output on the coordinator, and replace was 40% of its time
        return RequestOutput(request_id=self.request_id, new_token_ids=new_tokens, new_text=text, finished=finished,
                             finish_reason=raw.finish_reason if finished else None,
                             num_prompt_tokens=raw.num_prompt_tokens, num_cached_tokens=raw.num_cached_tokens,
                             logits=raw.logits, logprobs=raw.logprobs)


@dataclass
class TransferLog:
    requests: int = 0
    bytes: int = 0
    send_seconds: float = 0.0
    exposed_seconds: float = 0.0
    local_prefills: int = 0  # turns prefilled where they decode, nothing sent

    @property
    def hidden_fraction(self) -> float:
        """Share of KV sending that overlapped the prefill's own compute."""
        return 1.0 - self.exposed_seconds / self.send_seconds if self.send_seconds else 0.0
