"""Metrics rendered as Prometheus text and parsed back: names with the `agentserve:` prefix, values, types."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.core.stats import EngineStats
from gateway.metrics import Metrics

HISTOGRAMS = ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "admission_wait_seconds", "gateway_overhead_seconds"]
COUNTERS = ["prompt_tokens", "generation_tokens", "cached_tokens", "pruned_tokens", "masked_tokens",
            "prefix_cache_queries", "prefix_cache_hits", "requests", "turns", "rejected_requests",
            "aborted_requests"]
GAUGES = ["num_requests_running", "num_requests_waiting", "num_sessions", "num_workers", "kv_cache_usage_perc",
          "kv_blocks_free"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: Metrics) -> tuple[dict[str, str], Samples]:
    """Family name -> type, and (sample name, sorted labels) -> value."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    types, samples = {}, {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[("agentserve:" + name, tuple(sorted(labels.items())))]


def test_every_metric_is_exposed_with_its_type_and_prefix() -> None:
    types, _ = scrape(Metrics())
    for name in HISTOGRAMS:
        assert types["agentserve:" + name] == "histogram"
    for name in COUNTERS:
        assert types["agentserve:" + name] == "counter"
    for name in GAUGES:
        assert types["agentserve:" + name] == "gauge"


def test_no_created_timestamps() -> None:
    metrics = Metrics()
    metrics.rejected("auth")
    body, _ = metrics.render()
    assert b"_created" not in body


def test_instances_own_separate_registries() -> None:
    first, second = Metrics(), Metrics()
    first.rejected("rate_limit")
    assert value(scrape(first)[1], "rejected_requests_total", reason="rate_limit") == 1
    assert ("agentserve:rejected_requests_total", (("reason", "rate_limit"),)) not in scrape(second)[1]


def test_a_streamed_request_lifecycle() -> None:
    metrics = Metrics()
    trace = metrics.request_started("chat", now=10.0)
    metrics.handed_to_engine(trace, now=10.002)
    metrics.first_token(trace, now=10.25)
    metrics.token(trace, now=10.27)
    metrics.token(trace, num_tokens=2, now=10.31)
    metrics.finished(trace, "stop", prompt_tokens=120, cached_tokens=100, pruned_tokens=30, masked_tokens=7,
                     queue_time_s=0.05, now=10.5)
    _, samples = scrape(metrics)
    assert trace.generation_tokens == 4
    assert value(samples, "generation_tokens_total") == 4
    assert value(samples, "prompt_tokens_total") == 120
    assert value(samples, "cached_tokens_total") == 100
    assert value(samples, "pruned_tokens_total") == 30
    assert value(samples, "masked_tokens_total") == 7
    assert value(samples, "requests_total", endpoint="chat", finish_reason="stop") == 1
    assert value(samples, "aborted_requests_total") == 0
    assert value(samples, "time_to_first_token_seconds_sum") == 0.25
    assert value(samples, "time_to_first_token_seconds_bucket", le="0.1") == 0
    assert value(samples, "time_to_first_token_seconds_bucket", le="0.25") == 1
    assert value(samples, "inter_token_latency_seconds_count") == 3
    assert abs(value(samples, "inter_token_latency_seconds_sum") - 0.06) < 1e-9
    assert value(samples, "inter_token_latency_seconds_bucket", le="0.025") == 3
    assert value(samples, "e2e_request_latency_seconds_sum") == 0.5
    assert value(samples, "request_queue_time_seconds_count") == 1
    assert value(samples, "gateway_overhead_seconds_bucket", le="0.0025") == 1
    assert value(samples, "gateway_overhead_seconds_bucket", le="0.001") == 0


def test_the_wait_in_the_admission_line_is_its_own_figure_not_the_gateways_overhead() -> None:
    metrics = Metrics()
    admitted = metrics.request_started("chat", now=10.0)
    metrics.admission_waited(admitted, 2.0, admitted=True)
    metrics.handed_to_engine(admitted, now=12.003)
    metrics.admission_waited(metrics.request_started("chat", now=11.0), 40.0, admitted=False)
    _, samples = scrape(metrics)
    assert value(samples, "admission_wait_seconds_sum", outcome="admitted") == 2.0
    assert value(samples, "admission_wait_seconds_bucket", outcome="refused", le="30.0") == 0
    assert value(samples, "admission_wait_seconds_count", outcome="refused") == 1
    assert value(samples, "gateway_overhead_seconds_bucket", le="0.005") == 1  # 3 ms, the 2 s in line excluded
    assert value(samples, "gateway_overhead_seconds_bucket", le="0.0025") == 0


def test_token_before_first_token_counts_as_the_first() -> None:
    metrics = Metrics()
    trace = metrics.request_started("responses", now=0.0)
    metrics.token(trace, num_tokens=3, now=0.5)
    _, samples = scrape(metrics)
    assert value(samples, "time_to_first_token_seconds_count") == 1
    assert value(samples, "inter_token_latency_seconds_count") == 0
    assert value(samples, "generation_tokens_total") == 3


def test_aborts_rejections_turns_sessions_workers() -> None:
    metrics = Metrics()
    metrics.finished(metrics.request_started("responses", now=0.0), "abort", now=1.0)
    for reason in ("rate_limit", "rate_limit", "ttft_slo"):
        metrics.rejected(reason)
    for phase in ("think", "act", "act"):
        metrics.turn(phase)
    metrics.set_sessions(12)
    metrics.set_workers("prefill", 3)
    metrics.set_workers("decode", 5)
    _, samples = scrape(metrics)
    assert value(samples, "aborted_requests_total") == 1
    assert value(samples, "requests_total", endpoint="responses", finish_reason="abort") == 1
    assert value(samples, "time_to_first_token_seconds_count") == 0
    assert value(samples, "rejected_requests_total", reason="rate_limit") == 2
    assert value(samples, "rejected_requests_total", reason="ttft_slo") == 1
    assert value(samples, "turns_total", phase="think") == 1
    assert value(samples, "turns_total", phase="act") == 2
    assert value(samples, "num_sessions") == 12
    assert value(samples, "num_workers", role="prefill") == 3
    assert value(samples, "num_workers", role="decode") == 5


def test_sync_engine_sets_gauges_and_turns_totals_into_increments() -> None:
    metrics = Metrics()
    metrics.sync_engine(EngineStats(running=4, waiting=2, kv_usage=0.375, kv_blocks_free=80,
                                    prefix_cache_queries=100, prefix_cache_hits=60, workers={"prefill": 2, "decode": 2},
                                    alerts={"kv_hit_ratio": 1, "retransmits": 0}, role_moves=3))
    for _ in range(2):
        metrics.sync_engine(EngineStats(running=1, waiting=0, kv_usage=0.5, kv_blocks_free=64,
                                        prefix_cache_queries=150, prefix_cache_hits=90,
                                        workers={"prefill": 1, "decode": 3}, alerts={"kv_hit_ratio": 0}, role_moves=4,
                                        capacity_target={"prefill": 1, "decode": 3}, last_move_at=1700000000.5))
    _, samples = scrape(metrics)
    assert value(samples, "num_requests_running") == 1
    assert value(samples, "num_requests_waiting") == 0
    assert value(samples, "kv_cache_usage_perc") == 0.5
    assert value(samples, "kv_blocks_free") == 64
    assert value(samples, "prefix_cache_queries_total") == 150
    assert value(samples, "prefix_cache_hits_total") == 90
    assert value(samples, "num_workers", role="prefill") == 1
    assert value(samples, "num_workers", role="decode") == 3
    assert value(samples, "capacity_alert", alert="kv_hit_ratio") == 0
    assert value(samples, "capacity_alert", alert="retransmits") == 0
    assert value(samples, "capacity_role_moves_total") == 4
    assert value(samples, "capacity_target_workers", role="decode") == 3
    assert value(samples, "capacity_last_move_timestamp_seconds") == 1700000000.5


def test_sync_engine_survives_an_engine_restart_and_several_sources() -> None:
    metrics = Metrics()
    for source, queries, hits in [("worker-0", 100, 50), ("worker-1", 30, 10), ("worker-0", 20, 5)]:  # 0 restarted
        metrics.sync_engine(EngineStats(kv_blocks_free=10, prefix_cache_queries=queries, prefix_cache_hits=hits),
                            source=source)
    _, samples = scrape(metrics)
    assert value(samples, "prefix_cache_queries_total") == 150
    assert value(samples, "prefix_cache_hits_total") == 65


def test_sample_names_keep_the_colon_of_their_family() -> None:
    metrics = Metrics()
    metrics.rejected("auth")
    metrics.set_workers("decode", 1)
    body, _ = metrics.render()
    family = ""
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
        elif line and not line.startswith("#"):
            assert family.startswith("agentserve:") and line.startswith(family), line
