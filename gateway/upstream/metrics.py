"""The upstream pool's metrics, on the gateway's registry (`gateway.metrics.Metrics.registry`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gateway.metrics import PREFIX


class UpstreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(PREFIX + "upstream_requests_total",
                                "Tries sent to upstream replicas, by replica and outcome (ok, failed, cut, refused).",
                                ("upstream", "outcome"), registry=registry)
        self.failovers = Counter(PREFIX + "upstream_failovers_total",
                                 "Requests retried on another replica after one failed before its first output.",
                                 registry=registry)
        self.unapplied_masked_tokens = Counter(
            PREFIX + "upstream_unapplied_masked_tokens_total",
            "History tokens the session's sparse masks would skip, sent unmasked: KV-level masks are the "
            "embedded engine's and unavailable upstream.", registry=registry)
        self.unavailable = Counter(PREFIX + "upstream_unavailable_total",
                                   "Requests answered 502/503 because no replica could take them.", ("status",),
                                   registry=registry)
