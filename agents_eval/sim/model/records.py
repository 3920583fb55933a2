"""What the simulator records per request and per role change."""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy


@dataclass(eq=False)
class RequestRecord:
    request_id: str
    session_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # the reply's length (max_tokens, ignore_eos)
    uncached_tokens: int  # prompt tokens the gateway expected to be prefilled (for admitted work)
    done: simpy.Event
    decode_worker: int = 0
    prefill_worker: int | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    tokens: int = 0
    kv_transfer_s: float = 0.0
    computed_prompt_tokens: int = 0  # prompt tokens its workers computed (neither cached nor transferred)
    output_ids: list[int] = field(default_factory=list)  # the reply's tokens, for the session's next prompt
    token_times: list[float] | None = None  # each token's time, where a caller asks for them (a list to fill)

    @property
    def ttft_s(self) -> float:
        assert self.first_token_s is not None, "request not started"
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.tokens < 2 or self.first_token_s is None or self.last_token_s is None:
            return 0.0
        return (self.last_token_s - self.first_token_s) / (self.tokens - 1)


@dataclass(frozen=True)
class RoleChange:
    at_s: float
    worker_id: int
    role: str


@dataclass(frozen=True)
class Decided:
    """One controller tick: the demand it read (workers each role keeps busy), the split then and its target."""

    at_s: float
    prefill_demand: float
    decode_demand: float
    prefill: int  # prefill workers at the tick
    target: int  # prefill workers the policy asked for
    held: bool  # the move was held back (hold_s)


@dataclass
class RunLog:
    requests: list[RequestRecord] = field(default_factory=list)
    role_changes: list[RoleChange] = field(default_factory=list)  # the controller's moves, when decided
    roles_applied: list[RoleChange] = field(default_factory=list)  # a moved worker serving in its new role
    decisions: list[Decided] = field(default_factory=list)
    splits: list[tuple[float, int, int]] = field(default_factory=list)  # (at, prefill workers, decode workers)
    steps: int = 0
