"""The coordinator's record of each request in flight and of the KV transfers it saw."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.mask import MaskedSpan
from engine.sampling import SamplingParams
from engine.sequence import SessionRef


@dataclass
class Tracked:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    masked_spans: tuple[MaskedSpan, ...] = ()
    session: SessionRef | None = None
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
