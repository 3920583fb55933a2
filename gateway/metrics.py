"""Prometheus metrics, named like vLLM's under `agentserve:`. Each `Metrics` owns its own registry, so apps and
tests never share state. Hit rates are two counters (queries, hits); the engine's cumulative prefix-cache
numbers become counter increments in `sync_engine`."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from engine import EngineStats, WorkerReport
from gateway.engine_counters import GrammarMetrics

PREFIX = "agentserve:"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the classic format every Prometheus reads
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
WORKER = ("worker", "role", "node")  # labels of the per-worker gauges
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class RequestTrace:
    """One request's timestamps, from `Metrics.request_started`; handed back to the other lifecycle methods."""

    endpoint: str
    arrived_at: float
    first_token_at: float | None = None
    last_token_at: float | None = None
    generation_tokens: int = 0
    admission_wait_s: float = 0.0  # in the gateway's admission line: not the gateway's own overhead


@dataclass
class Histograms:
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    admission_wait: Histogram
    gateway_overhead: Histogram


@dataclass
class Counters:
    prompt_tokens: Counter
    generation_tokens: Counter
    cached_tokens: Counter
    pruned_tokens: Counter
    masked_tokens: Counter
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    requests: Counter
    turns: Counter
    rejected: Counter
    aborted: Counter
    role_moves: Counter
    kv_transfers: Counter
    load_signal_failures: Counter


@dataclass
class Gauges:
    running: Gauge
    waiting: Gauge
    sessions: Gauge
    workers: Gauge
    kv_usage: Gauge
    kv_blocks_free: Gauge
    capacity_alerts: Gauge
    capacity_target: Gauge
    capacity_last_move: Gauge
    forecaster: Gauge
    worker_running: Gauge
    worker_waiting_prefill_tokens: Gauge
    worker_decode_streams: Gauge
    worker_kv_usage: Gauge


def _histograms(registry: CollectorRegistry) -> Histograms:
    def histogram(name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()) -> Histogram:
        return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=registry)

    return Histograms(
        ttft=histogram("time_to_first_token_seconds", "Time to first token, from arrival at the gateway.",
                       TTFT_BUCKETS),
        itl=histogram("inter_token_latency_seconds", "Time between consecutive output tokens.", ITL_BUCKETS),
        e2e=histogram("e2e_request_latency_seconds", "End-to-end request latency.", LATENCY_BUCKETS),
        queue_time=histogram("request_queue_time_seconds", "Time requests spent waiting in the engine queue.",
                             LATENCY_BUCKETS),
        admission_wait=histogram("admission_wait_seconds", "Time requests waited in the gateway's admission line, "
                                 "by outcome: admitted, or refused (503) once the wait would break the TTFT budget.",
                                 LATENCY_BUCKETS, ("outcome",)),
        gateway_overhead=histogram("gateway_overhead_seconds", "Time the gateway spends on a request before "
                                   "handing it to the engine (session load, tokenizing, pruning, routing), its "
                                   "wait in the admission line excluded.", OVERHEAD_BUCKETS))


def _counters(registry: CollectorRegistry) -> Counters:
    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(PREFIX + name, doc, labels, registry=registry)

    return Counters(
        prompt_tokens=counter("prompt_tokens_total", "Prompt tokens of finished requests."),
        generation_tokens=counter("generation_tokens_total", "Generated tokens."),
        cached_tokens=counter("cached_tokens_total", "Prompt tokens served from cached KV instead of prefilled."),
        pruned_tokens=counter("pruned_tokens_total", "Tokens pruned from observations on ingest."),
        masked_tokens=counter("masked_tokens_total", "History tokens skipped by sparse attention masks."),
        prefix_cache_queries=counter("prefix_cache_queries_total", "Tokens looked up in the prefix cache."),
        prefix_cache_hits=counter("prefix_cache_hits_total", "Tokens found in the prefix cache."),
        requests=counter("requests_total", "Finished requests.", ("endpoint", "finish_reason")),
        turns=counter("turns_total", "Agent turns by phase.", ("phase",)),
        rejected=counter("rejected_requests_total", "Requests refused before reaching the engine.", ("reason",)),
        aborted=counter("aborted_requests_total", "Requests aborted before they finished."),
        role_moves=counter("capacity_role_moves_total", "Workers the capacity controller moved between roles."),
        kv_transfers=counter("kv_transfers_total", "KV transfers decode workers received, by outcome: received, "
                             "rejected (a bad frame), timed_out, recomputed (the prompt prefilled again).",
                             ("outcome",)),
        load_signal_failures=counter("load_signal_failures_total", "Pushes of the agents' load signals to the "
                                     "capacity controller that failed."))


def _gauges(registry: CollectorRegistry) -> Gauges:
    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(PREFIX + name, doc, labels, registry=registry)

    return Gauges(
        running=gauge("num_requests_running", "Requests the engine is running."),
        waiting=gauge("num_requests_waiting", "Requests waiting in the engine queue."),
        sessions=gauge("num_sessions", "Agent sessions held by the gateway."),
        workers=gauge("num_workers", "Engine workers by role.", ("role",)),
        kv_usage=gauge("kv_cache_usage_perc", "KV cache usage as a fraction: 0 is empty, 1 is full."),
        kv_blocks_free=gauge("kv_blocks_free", "Free KV cache blocks."),
        capacity_alerts=gauge("capacity_alert", "1 while a capacity inflection alert fires.", ("alert",)),
        capacity_target=gauge("capacity_target_workers", "Workers per role the capacity controller's last decision "
                              "wants.", ("role",)),
        capacity_last_move=gauge("capacity_last_move_timestamp_seconds", "Unix time of the capacity controller's "
                                 "latest move."),
        forecaster=gauge("forecaster_info", "1 for the forecaster the capacity controller reads (lstm, last_value, "
                         "ema or none) and why.", ("forecaster", "reason")),
        worker_running=gauge("worker_num_requests_running", "Requests an engine worker is running.", WORKER),
        worker_waiting_prefill_tokens=gauge("worker_prefill_tokens_waiting", "Prompt tokens queued on an engine "
                                            "worker, not yet prefilled.", WORKER),
        worker_decode_streams=gauge("worker_decode_streams", "Requests an engine worker is decoding.", WORKER),
        worker_kv_usage=gauge("worker_kv_cache_usage_perc", "An engine worker's KV cache usage (0 to 1).", WORKER))


@dataclass
class CumulativeBaseline:
    """The last cumulative value seen per source, to turn engine totals into counter increments."""

    last: dict[str, float] = field(default_factory=dict)

    def delta(self, source: str, total: float) -> float:
        previous = self.last.get(source, 0.0)
        self.last[source] = total
        return total if total < previous else total - previous  # a drop means the source restarted at 0


@dataclass(frozen=True)
class WithoutCreated:
    """A registry's metrics minus the `_created` timestamp series, as vLLM exposes them."""

    registry: CollectorRegistry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            if metric.type in ("counter", "histogram"):
                metric.samples = [sample for sample in metric.samples if not sample.name.endswith("_created")]
            yield metric


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.histograms = _histograms(self.registry)
        self.counters = _counters(self.registry)
        self.gauges = _gauges(self.registry)
        self._queries = CumulativeBaseline()
        self._hits = CumulativeBaseline()
        self._moves = CumulativeBaseline()
        self._transfers = CumulativeBaseline()
        self._failures = CumulativeBaseline()
        self._grammar = GrammarMetrics.register(self.registry)

    def request_started(self, endpoint: str, now: float | None = None) -> RequestTrace:
        return RequestTrace(endpoint, _now(now))

    def admission_waited(self, trace: RequestTrace, seconds: float, admitted: bool) -> None:
        trace.admission_wait_s = seconds
        self.histograms.admission_wait.labels("admitted" if admitted else "refused").observe(max(0.0, seconds))

    def handed_to_engine(self, trace: RequestTrace, now: float | None = None) -> None:
        overhead = _now(now) - trace.arrived_at - trace.admission_wait_s
        self.histograms.gateway_overhead.observe(max(0.0, overhead))

    def first_token(self, trace: RequestTrace, num_tokens: int = 1, now: float | None = None) -> None:
        now = _now(now)
        trace.first_token_at = trace.last_token_at = now
        self.histograms.ttft.observe(max(0.0, now - trace.arrived_at))
        self._count_generated(trace, num_tokens)

    def token(self, trace: RequestTrace, num_tokens: int = 1, now: float | None = None) -> None:
        """`num_tokens` more output tokens; a chunk of several counts as that many evenly spaced tokens."""
        if trace.last_token_at is None:
            self.first_token(trace, num_tokens, now)
            return
        now = _now(now)
        gap = max(0.0, now - trace.last_token_at) / max(1, num_tokens)
        for _ in range(num_tokens):
            self.histograms.itl.observe(gap)
        trace.last_token_at = now
        self._count_generated(trace, num_tokens)

    def _count_generated(self, trace: RequestTrace, num_tokens: int) -> None:
        trace.generation_tokens += num_tokens
        self.counters.generation_tokens.inc(num_tokens)

    def finished(self, trace: RequestTrace, finish_reason: str, *, prompt_tokens: int = 0, cached_tokens: int = 0,
                 pruned_tokens: int = 0, masked_tokens: int = 0, queue_time_s: float | None = None,
                 now: float | None = None) -> None:
        """The request is over: `finish_reason` is "stop", "length", "abort", "error", ..."""
        self.histograms.e2e.observe(max(0.0, _now(now) - trace.arrived_at))
        if queue_time_s is not None:
            self.histograms.queue_time.observe(queue_time_s)
        self.counters.requests.labels(trace.endpoint, finish_reason).inc()
        if finish_reason == "abort":
            self.counters.aborted.inc()
        self.counters.prompt_tokens.inc(prompt_tokens)
        self.counters.cached_tokens.inc(cached_tokens)
        self.counters.pruned_tokens.inc(pruned_tokens)
        self.counters.masked_tokens.inc(masked_tokens)

    def rejected(self, reason: str) -> None:
        """A request refused before the engine: "auth", "rate_limit", "ttft_slo", ..."""
        self.counters.rejected.labels(reason).inc()

    def turn(self, phase: str) -> None:
        self.counters.turns.labels(phase).inc()

    def set_sessions(self, count: int) -> None:
        self.gauges.sessions.set(count)

    def sync_workers(self, reports: Sequence[WorkerReport]) -> None:
        """Each live worker's load, labelled by worker, role and node; a moved or dead worker's old series go."""
        gauges = (self.gauges.worker_running, self.gauges.worker_waiting_prefill_tokens,
                  self.gauges.worker_decode_streams, self.gauges.worker_kv_usage)
        for gauge in gauges:
            gauge.clear()
        for report in reports:
            labels = (str(report.worker), report.role, report.node)
            s = report.stats
            for gauge, value in zip(gauges, (s.running, s.prefill_tokens_waiting, s.decode_streams, s.kv_usage),
                                    strict=True):
                gauge.labels(*labels).set(value)

    def set_workers(self, role: str, count: int) -> None:
        self.gauges.workers.labels(role).set(count)

    def sync_engine(self, stats: EngineStats, source: str = "engine") -> None:
        """An engine stats snapshot. Prefix-cache numbers are the engine's cumulative totals (tokens)."""
        self.gauges.running.set(stats.running)
        self.gauges.waiting.set(stats.waiting)
        self.gauges.kv_usage.set(stats.kv_usage)
        self.gauges.kv_blocks_free.set(stats.kv_blocks_free)
        for role, count in stats.workers.items():
            self.set_workers(role, count)
        for alert, firing in stats.alerts.items():
            self.gauges.capacity_alerts.labels(alert).set(firing)
        self.counters.role_moves.inc(self._moves.delta(source, stats.role_moves))
        for role, count in stats.capacity_target.items():
            self.gauges.capacity_target.labels(role).set(count)
        if stats.last_move_at is not None:
            self.gauges.capacity_last_move.set(stats.last_move_at)
        self.counters.prefix_cache_queries.inc(self._queries.delta(source, stats.prefix_cache_queries))
        self.counters.prefix_cache_hits.inc(self._hits.delta(source, stats.prefix_cache_hits))
        for outcome, total in stats.kv_transfers.items():
            self.counters.kv_transfers.labels(outcome).inc(self._transfers.delta(f"{source}:{outcome}", total))
        self._grammar.sync(stats.grammar, stats.history, source)

    def sync_signals(self, forecaster: str, reason: str, failures: int) -> None:
        """Which forecaster the controller reads and why; the load-signal pushes that failed (cumulative)."""
        self.gauges.forecaster.clear()
        self.gauges.forecaster.labels(forecaster, reason).set(1)
        self.counters.load_signal_failures.inc(self._failures.delta("signals", failures))

    def sync_kv_tiers(self, stats: Mapping[str, Any] | None, source: str = "engine") -> None:
        """The engine's KV tier counters (`LLMEngine.kv_tier_stats()`; None: no tiers), and each tier's hit ratio
        since the start (`kvcache_hit_ratio{tier}`; over a window: kvcache_tier_hits_total over
        kvcache_tier_queries_total)."""
        if stats is None:
            return
        tiers = self._tiers
        for tier, counts in stats["tiers"].items():
            for name, counter in tiers.counters.items():
                counter.labels(tier).inc(tiers.baseline.delta(f"{source}:{tier}:{name}", counts[name]))
            tiers.blocks.labels(tier).set(counts["blocks"])
            tiers.bytes.labels(tier).set(counts["bytes"])
            tiers.hit_ratio.labels(tier).set(counts["hits"] / counts["queries"] if counts["queries"] else 0.0)
        for outcome in ("loaded", "recomputed"):
            tiers.decisions.labels(outcome).inc(tiers.baseline.delta(f"{source}:{outcome}", stats[outcome]))

    @functools.cached_property
    def _tiers(self) -> TierMetrics:
        return TierMetrics.register(self.registry)

    def render(self) -> tuple[bytes, str]:
        """The `/metrics` body and its content type: always the classic text format, whatever the scraper's
        `Accept` asks. prometheus_client's OpenMetrics encoder turns `:` into `_` in sample lines but not in
        HELP/TYPE (prometheus/client_python#1177), which breaks every `agentserve:` name."""
        return generate_latest(WithoutCreated(self.registry)), TEXT_CONTENT_TYPE


@dataclass
class TierMetrics:
    """Per-tier KV hierarchy metrics, registered on the first `sync_kv_tiers` (engines without tiers have none)."""

    counters: dict[str, Counter]  # TierStats field -> counter labelled by tier
    blocks: Gauge
    bytes: Gauge
    decisions: Counter
    hit_ratio: Gauge  # hits / queries since the engine started: for a rate window, use the two counters
    baseline: CumulativeBaseline = field(default_factory=CumulativeBaseline)

    @classmethod
    def register(cls, registry: CollectorRegistry) -> TierMetrics:
        docs = {"queries": ("kvcache_tier_queries_total", "Block lookups that reached a KV tier."),
                "hits": ("kvcache_tier_hits_total", "Block lookups a KV tier answered."),
                "promoted": ("kvcache_promoted_blocks_total", "Blocks read out of a tier back to the device."),
                "demoted": ("kvcache_demoted_blocks_total", "Blocks written down into a tier."),
                "skipped": ("kvcache_tier_skipped_total", "Tier operations skipped while it was unavailable."),
                "corrupt": ("kvcache_corrupt_blocks_total", "Stored blocks that failed their checks (recomputed).")}
        counters = {field_name: Counter(PREFIX + name, doc, ("tier",), registry=registry)
                    for field_name, (name, doc) in docs.items()}
        return cls(counters, Gauge(PREFIX + "kvcache_blocks", "KV blocks a tier holds.", ("tier",), registry=registry),
                   Gauge(PREFIX + "kvcache_bytes", "Bytes of KV a tier holds.", ("tier",), registry=registry),
                   Counter(PREFIX + "kvcache_load_decisions_total", "Blocks a lower tier held, by outcome: loaded, "
                           "or recomputed (cheaper than loading).", ("outcome",), registry=registry),
                   Gauge(PREFIX + "kvcache_hit_ratio", "Block lookups a KV tier answered, of those that reached it, "
                         "since the start.", ("tier",), registry=registry))


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now
