"""What an engine (one worker) reports of its load: for the gateway's metrics and the capacity controller.
Pure data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.capacity.signals import AdmittedWork
from engine.core.sampling.grammar_spec import GrammarCounters
from engine.core.sequence import Sequence
from engine.model.mask import HistoryCounters


@dataclass
class DecodeLine:
    """A decode step's time against the streams in it, t(b) = base_s + per_stream_s x b: least squares over
    the decode-only steps, each weighted (1 - alpha) less than the next (its memory is about 1 / alpha
    steps). Batching makes a stream's token cost fall as streams share a step, so a worker's seconds per
    token depend on its batch: this line, not one step time, says how many workers a number of streams needs.
    Unknown (None) until the steps seen span batch sizes with a variance of at least `min_batch_variance`."""

    alpha: float = 0.02
    min_batch_variance: float = 1.0
    moments: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)  # exponentially weighted means of 1, b, t, b*b, b*t

    def observe(self, streams: int, seconds: float) -> None:
        new = (1.0, streams, seconds, streams * streams, streams * seconds)
        self.moments = tuple(m + self.alpha * (x - m) for m, x in zip(self.moments, new, strict=True))

    def line(self) -> tuple[float, float] | None:
        """(base_s, per_stream_s), both at least 0; None until fitted."""
        weight, b, t, bb, bt = self.moments
        if weight == 0.0:
            return None
        b, t, bb, bt = b / weight, t / weight, bb / weight, bt / weight
        variance = bb - b * b
        if variance < self.min_batch_variance:
            return None
        per_stream = max(0.0, (bt - b * t) / variance)
        return max(0.0, t - per_stream * b), per_stream


@dataclass
class StallFit:
    """Seconds that prompt tokens add to a step beyond what its decode streams take (the decode line at the
    step's streams): least squares through the origin over the steps that mix both, each weighted (1 - alpha)
    less than the next. A chunk of c tokens beside b streams holds those streams about c / `tokens_per_s()`
    longer; the step's whole time over c (the prefill throughput) counts the streams' own share as prefill."""

    alpha: float = 0.1
    moments: tuple[float, float] = (0.0, 0.0)  # exponentially weighted means of c*c and c*extra_s

    def observe(self, tokens: int, extra_s: float) -> None:
        cc, ce = self.moments
        self.moments = (cc + self.alpha * (tokens * tokens - cc), ce + self.alpha * (tokens * extra_s - ce))

    def tokens_per_s(self) -> float:
        """0 until a mixed step was seen (or while the fit says prompt tokens cost nothing)."""
        cc, ce = self.moments
        return cc / ce if cc > 0 and ce > 0 else 0.0


@dataclass
class StepTimer:
    """Exponential moving averages of how long steps take: decode-only steps (seconds per output token
    of one stream) and prefill throughput (prompt tokens computed per second); the decode step's line
    against its batch size; and what prompt tokens add to a step that also decodes (`StallFit`)."""

    alpha: float = 0.2
    decode_step_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_line: DecodeLine = field(default_factory=DecodeLine)
    stall: StallFit = field(default_factory=StallFit)

    def observe(self, seconds: float, prefill_tokens: int, decode_streams: int = 1) -> None:
        """One step: its seconds, the prompt tokens it computed, and the streams it decoded a token for."""
        if not prefill_tokens:
            self.decode_step_s = ema(self.decode_step_s, seconds, self.alpha)
            self.decode_line.observe(decode_streams, seconds)
            return
        rate = prefill_tokens / max(seconds, 1e-9)
        self.prefill_tokens_per_s = ema(self.prefill_tokens_per_s, rate, self.alpha)
        decode_s = self.decode_s(decode_streams)
        if decode_streams and decode_s is not None:
            self.stall.observe(prefill_tokens, seconds - decode_s)

    def decode_s(self, streams: int) -> float | None:
        """A decode-only step's time at this many streams: the line, or the average step until it is fitted."""
        line = self.decode_line.line()
        if line is not None:
            return line[0] + line[1] * streams
        return self.decode_step_s or None

    @property
    def prefill_stall_tokens_per_s(self) -> float:
        return self.stall.tokens_per_s()


@dataclass(frozen=True)
class WorkerReport:
    """One engine worker as the serving process last heard of it: the per-worker metrics."""

    worker: int
    role: str
    node: str  # "local", or its Ray node id
    stats: EngineStats


def ema(old: float, new: float, alpha: float) -> float:
    """An exponential moving average step; 0 means nothing measured yet, so the first value is taken whole."""
    return new if old == 0.0 else (1 - alpha) * old + alpha * new


@dataclass
class EngineStats:
    running: int = 0
    waiting: int = 0
    prefill_tokens_waiting: int = 0  # prompt tokens queued or mid-prefill, not yet computed
    oldest_wait_s: float = 0.0  # of the requests not yet started
    decode_streams: int = 0  # running requests past their prefill
    kv_usage: float = 0.0  # fraction of KV blocks in use
    kv_blocks_free: int = 0
    prefix_cache_queries: int = 0  # cumulative
    prefix_cache_hits: int = 0  # cumulative
    decode_step_s: float = 0.0  # EMA; 0 until a decode-only step ran
    prefill_tokens_per_s: float = 0.0  # EMA; 0 until a prefill ran
    decode_line: tuple[float, float] | None = None  # DecodeLine.line(): (base_s, per_stream_s); None until fitted
    workers: dict[str, int] = field(default_factory=dict)  # role -> count
    alerts: dict[str, int] = field(default_factory=dict)  # capacity alert -> 1 while firing
    role_moves: int = 0  # cumulative role changes the capacity controller made
    capacity_target: dict[str, int] = field(default_factory=dict)  # role -> workers the last decision wanted
    last_move_at: float | None = None  # unix seconds of the controller's latest move
    kv_transfers: dict[str, int] = field(default_factory=dict)  # outcome -> cumulative KV transfers received
    prefill_stall_tokens_per_s: float = 0.0  # StallFit; 0 until a step mixed prefill with decoding
    grammar: GrammarCounters = field(default_factory=GrammarCounters)  # structured outputs, cumulative
    history: HistoryCounters = field(default_factory=HistoryCounters)  # history blocks picks, cumulative

    @classmethod
    def total(cls, parts: list[EngineStats], workers: dict[str, int]) -> EngineStats:
        """Counts summed; latencies averaged over the parts that measured them."""
        def mean(values: list[float]) -> float:
            measured = [v for v in values if v > 0]
            return sum(measured) / len(measured) if measured else 0.0

        transfers: dict[str, int] = {}
        grammar, history = GrammarCounters(), HistoryCounters()
        for part in parts:
            grammar.add(part.grammar)
            history.add(part.history)
            for outcome, count in part.kv_transfers.items():
                transfers[outcome] = transfers.get(outcome, 0) + count
        return cls(sum(p.running for p in parts), sum(p.waiting for p in parts),
                   sum(p.prefill_tokens_waiting for p in parts), max((p.oldest_wait_s for p in parts), default=0.0),
                   sum(p.decode_streams for p in parts), mean([p.kv_usage for p in parts]),
                   sum(p.kv_blocks_free for p in parts), sum(p.prefix_cache_queries for p in parts),
                   sum(p.prefix_cache_hits for p in parts), mean([p.decode_step_s for p in parts]),
                   mean([p.prefill_tokens_per_s for p in parts]), mean_line([p.decode_line for p in parts]),
                   workers, kv_transfers=transfers,
                   prefill_stall_tokens_per_s=mean([p.prefill_stall_tokens_per_s for p in parts]), grammar=grammar,
                   history=history)


def mean_line(lines: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The mean of the fitted decode lines (base_s, per_stream_s); None when none is fitted."""
    fitted = [line for line in lines if line is not None]
    if not fitted:
        return None
    return sum(b for b, _ in fitted) / len(fitted), sum(p for _, p in fitted) / len(fitted)


def queue_stats(running: list[Sequence], waiting: list[Sequence], now: float) -> EngineStats:
    """EngineStats with the queue-shaped fields filled."""
    in_prefill = [s for s in running if s.num_computed_tokens < s.num_prompt_tokens]
    pending = in_prefill + waiting
    return EngineStats(running=len(running), waiting=len(waiting),
                       prefill_tokens_waiting=sum(s.num_prompt_tokens - s.num_computed_tokens for s in pending),
                       oldest_wait_s=max((now - s.arrival_time for s in waiting), default=0.0),
                       decode_streams=len(running) - len(in_prefill))


@dataclass(frozen=True)
class AgentSignals:
    """What the gateway knows of the agents' load that the engine cannot see: the think/act mix, the latest
    phase shift, the predictor's forecast for the next interval, and the work it admitted and has not yet seen
    served (None: no admission reports; `admitted_total` counts all work admitted since it started)."""

    think_share: float | None = None  # share of recent load that is think (prefill-heavy) turns
    shift: str | None = None  # "think" or "act": direction of the latest detected phase shift
    shift_at: float | None = None  # monotonic seconds when that shift was detected
    forecast_prefill_tokens: float = 0.0
    forecast_decode_tokens: float = 0.0
    admitted: AdmittedWork | None = None
    admitted_total: AdmittedWork = field(default_factory=AdmittedWork)
