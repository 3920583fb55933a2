"""What the capacity controller reads each interval. Times are seconds on the controller's clock (the caller
injects it: `time.monotonic()` in the coordinator, simulated time in the cluster simulator)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

_Figure = TypeVar("_Figure")

# The same strings as engine.workers.messages.PREFILL/DECODE (that module pulls in torch).
PREFILL, DECODE = "prefill", "decode"
ROLES = (PREFILL, DECODE)

Shift = Literal["think", "act"]


@dataclass(frozen=True)
class WorkerLoad:
    """One live worker. `running` counts every request it holds, prefilling or decoding."""

    worker_id: int
    role: str  # PREFILL or DECODE: where the coordinator routes new work
    running: int = 0
    waiting_prefill_tokens: int = 0  # prompt tokens queued or mid-prefill on it, not yet computed
    decode_streams: int = 0  # requests past their prefill, decoding on it
    last_switch_at: float | None = None  # when its role last changed; None: never
    prefill_tokens_per_s: float | None = None  # its measured prefill rate; None until it prefilled
    prefill_stall_tokens_per_s: float | None = None  # what prompt tokens add to its decoding steps (StallFit)
    kv_usage: float | None = None  # share of its KV blocks held (running requests, pinned histories); None: unknown

    @property
    def stall_tokens_per_s(self) -> float | None:
        """The rate at which prompt tokens prefilled here hold its streams: the stall fit, the prefill rate
        until it has one."""
        return self.prefill_stall_tokens_per_s or self.prefill_tokens_per_s

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"worker {self.worker_id}: role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class AdmittedWork:
    """Work the gateway admitted and has not yet seen served, as it knew it at admission: the uncached prompt
    tokens (after turn-delta reuse) of the `prompts` not yet past their first token, and the output tokens
    expected (`max_tokens`, or the predictor's forecast below it) of the `streams` not yet finished. Demand with
    no statistical delay: it rises when a turn is admitted and falls when the turn is served."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    streams: int = 0
    prompts: int = 0

    def __post_init__(self) -> None:
        if min(self.prefill_tokens, self.decode_tokens, self.streams, self.prompts) < 0:
            raise ValueError(f"admitted work cannot be negative, got {self}")

    def __add__(self, other: AdmittedWork) -> AdmittedWork:  # per request: plain fields (astuple deep-copies)
        return AdmittedWork(self.prefill_tokens + other.prefill_tokens, self.decode_tokens + other.decode_tokens,
                            self.streams + other.streams, self.prompts + other.prompts)

    def __sub__(self, other: AdmittedWork) -> AdmittedWork:
        return AdmittedWork(self.prefill_tokens - other.prefill_tokens, self.decode_tokens - other.decode_tokens,
                            self.streams - other.streams, self.prompts - other.prompts)


@dataclass(frozen=True)
class RoutedWork:
    """The placed prompts not yet past their prefill, split by `routing.Placement.for_prefill_worker`: the prefill
    workers' work (or what would be, where the deployment has none at the moment), and the decode workers' own.
    Uncached tokens, on the decode worker each was placed on."""

    remote_tokens: int = 0
    remote_prompts: int = 0
    local_tokens: int = 0
    remote_share: float = 1.0  # of the tokens of the recent placements (1 until any): the forecast's split


class RoutedPrefills:
    """The coordinator's account of `RoutedWork`: a prompt counts from its placement to its first token."""

    SHARE_DECAY = 0.95  # per placement: the share follows about the last 20 placements' tokens

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, bool]] = {}  # request id -> (uncached tokens, for a prefill worker)
        self._work = RoutedWork()
        self._routing = False  # a placement was reported: until then nothing routes (the policy reads the queues)
        self._recent = [0.0, 0.0]  # decayed sums of the placed tokens: for a prefill worker, all

    def placed(self, request_id: str, uncached_tokens: int, for_prefill_worker: bool) -> None:
        self.done(request_id)  # placed again (a re-run): the new placement replaces the old
        self._routing = True
        self._pending[request_id] = (uncached_tokens, for_prefill_worker)
        self._recent = [self.SHARE_DECAY * self._recent[0] + for_prefill_worker * uncached_tokens,
                        self.SHARE_DECAY * self._recent[1] + uncached_tokens]
        self._work = self._moved(uncached_tokens, for_prefill_worker, +1)

    def done(self, request_id: str) -> None:
        """Past its prefill (its first token), finished or aborted; unknown ids are ignored."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            self._work = self._moved(*entry, -1)

    def work(self) -> RoutedWork | None:
        return self._work if self._routing else None

    def _moved(self, tokens: int, for_prefill_worker: bool, sign: int) -> RoutedWork:
        work, (gated, placed) = self._work, self._recent
        share = gated / placed if placed else work.remote_share
        if for_prefill_worker:
            return RoutedWork(work.remote_tokens + sign * tokens, work.remote_prompts + sign, work.local_tokens, share)
        return RoutedWork(work.remote_tokens, work.remote_prompts, work.local_tokens + sign * tokens, share)


@dataclass(frozen=True)
class LoadSnapshot:
    """The engine's load at `now`.

    `tpot_s` is the mean decode step time of the workers that decode (seconds per output token of one stream,
    at their current batch); `decode_line` their mean fitted decode step time against its streams, (base_s,
    per_stream_s) (`engine.core.stats.DecodeLine`); `prefill_tokens_per_s` one worker's measured prefill rate. Each
    is None until measured; the policy then assumes the settings' rates. `think_share` is the phase monitor's
    think share of the recent mix (0..1) and `shift` the direction of its latest shift event within this
    interval, if any. The forecasts are the predictor's tokens expected within `forecast_horizon_s`. `admitted` is the
    gateway's admitted work (None when nothing reports it: the policy then reads the workers' queues). `routed` is
    the router's split of the placed prompts (None where nothing routes: the policy then reads the workers' queues).
    `max_streams_per_worker` is the engine's `max_num_seqs`: a worker runs at most that many requests at once, the
    rest wait for a slot (None: no bound known).
    """

    now: float
    workers: tuple[WorkerLoad, ...]
    tpot_s: float | None = None
    prefill_tokens_per_s: float | None = None
    think_share: float | None = None
    shift: Shift | None = None
    forecast_prefill_tokens: float = 0.0
    forecast_decode_tokens: float = 0.0
    admitted: AdmittedWork | None = None
    decode_line: tuple[float, float] | None = None
    routed: RoutedWork | None = None
    max_streams_per_worker: int | None = None

    def __post_init__(self) -> None:
        if self.shift not in (None, "think", "act"):
            raise ValueError(f"shift must be 'think', 'act' or None, got {self.shift!r}")
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"worker ids must be unique, got {ids}")

    @property
    def prefill_tokens_waiting(self) -> int:
        return sum(w.waiting_prefill_tokens for w in self.workers)

    @property
    def decode_streams(self) -> int:
        return sum(w.decode_streams for w in self.workers)

    def count(self, role: str) -> int:
        return sum(w.role == role for w in self.workers)


def role_figures(role: str, figures: Iterable[tuple[str, _Figure | None]]) -> list[_Figure]:
    """The measured figures of `role`'s workers, from (worker role, figure) pairs (a figure of 0 or None is not
    measured yet); where that role has none, every worker's: its work then runs on the other role's workers, and
    a model's speed does not change with a worker's role."""
    measured = [(worker_role, figure) for worker_role, figure in figures if figure]
    return [figure for worker_role, figure in measured if worker_role == role] or [figure for _, figure in measured]
