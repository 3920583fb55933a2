"""Typed control messages, one family per direction, pickled over a pipe. KV bytes never travel here:
they go from prefill to decode worker over the KV transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.output import RequestOutput
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.core.stats import EngineStats
from engine.model.mask import MaskedSpan, QuerySelection

PREFILL, DECODE = "prefill", "decode"


# a request moving from its prefill worker to its decode worker (in `AcceptHandoff`; its KV travels apart)
@dataclass
class Handoff:
    """What travels with a request from its prefill worker to its decode worker besides the KV bytes."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the first sampled token, after any its grammar forced before it
    params: SamplingParams
    sampler_state: bytes
    num_cached_tokens: int
    masked_spans: tuple[MaskedSpan, ...] = ()
    session: SessionRef | None = None  # pinned on the decode side when the turn finishes
    selection: QuerySelection | None = None  # the `query` policy, applied by the decode side
    selected_spans: tuple[MaskedSpan, ...] = ()  # what the prefill's last chunk picked for the first decode step

    @property
    def num_kv_tokens(self) -> int:
        return len(self.prompt_token_ids)


# coordinator -> worker
@dataclass
class Submit:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    masked_spans: tuple[MaskedSpan, ...] = ()
    decode_address: str | None = None  # set: prefill only, stream the KV there; None: run it whole here
    session: SessionRef | None = None  # the agent session whose KV the worker that decodes it pins
    selection: QuerySelection | None = None  # the `query` policy: decode picks the history blocks it reads


@dataclass
class ExpectKV:
    """A prefill worker is about to stream this request's KV here: poll the receivers until its hand-off."""

    request_id: str


@dataclass
class AcceptHandoff:
    handoff: Handoff


@dataclass
class Abort:
    request_id: str


@dataclass
class SetRole:
    role: str
    sent_at: float  # coordinator's clock, for the switch latency


@dataclass
class SetSessionTTL:
    key: str
    ttl_s: float


@dataclass
class Ping:
    sent_at: float


@dataclass
class Shutdown:
    deadline_s: float


@dataclass
class InjectKVFault:
    """Failure testing only: damage this prefill worker's KV transfers (see layer_sender.FAULTS)."""

    fault: str | None


@dataclass
class CountersQuery:
    pass


@dataclass
class ResetPrefixCache:
    """Forget every cached block (benchmarks; vLLM's /reset_prefix_cache); answered by `PrefixCacheReset`."""


@dataclass
class Listen:
    """Open a KV receiver for a worker that joined after this one started (answered by `Listening`)."""

    peer_id: int


Command = (Submit | ExpectKV | AcceptHandoff | Abort | SetRole | SetSessionTTL | Ping | Shutdown | InjectKVFault
           | CountersQuery | Listen | ResetPrefixCache)


# worker -> coordinator
@dataclass
class Ready:
    worker_id: int
    pid: int
    role: str
    kv_addresses: dict[int, str]  # peer worker id -> where that worker sends this one KV
    node: str = "local"  # where it runs: "local", or its Ray node id
    frozen_objects: int = 0  # what its startup heap left out of the collector's reach (engine.gc_heap)


@dataclass
class Hello:
    """A worker that dials in (a Ray actor) says who it is, before it loads the model."""

    worker_id: int


@dataclass
class PrefixCacheReset:
    worker_id: int
    done: bool  # False: a request still holds blocks


@dataclass
class Listening:
    worker_id: int
    peer_id: int
    address: str


@dataclass
class Outputs:
    outputs: list[RequestOutput]


@dataclass
class Prefilled:
    handoff: Handoff
    kv_bytes: int
    send_seconds: float  # time spent sending this request's KV
    exposed_seconds: float  # of it, time after the prefill compute finished (not hidden by compute)


@dataclass
class RoleChanged:
    role: str
    sent_at: float
    applied_at: float  # worker's clock; the coordinator corrects for the clock offset


@dataclass
class Pong:
    sent_at: float
    worker_time: float


@dataclass
class KVCounters:
    received: int = 0
    rejected: int = 0
    timed_out: int = 0
    recomputed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def outcomes(self) -> dict[str, int]:
        """Cumulative transfers by outcome: received whole, rejected (a bad frame), timed out, recomputed."""
        return {"received": self.received, "rejected": self.rejected, "timed_out": self.timed_out,
                "recomputed": self.recomputed}


@dataclass
class Stopped:
    counters: KVCounters


@dataclass
class Counters:
    worker_id: int
    counters: KVCounters


@dataclass
class Load:
    """Sent every report interval while the worker is busy, and once when it turns idle."""

    worker_id: int
    stats: EngineStats
    kv_tiers: dict[str, Any] | None = None  # its KV tier counters (LLMEngine.kv_tier_stats); None: no tiers


Event = (Load | Ready | Outputs | Prefilled | RoleChanged | Pong | Stopped | Counters | Hello | Listening
         | PrefixCacheReset)
