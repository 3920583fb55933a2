"""The Grafana dashboard (configs/grafana/agentserve.json) is importable JSON whose every query reads a
metric the gateway exports: with the colocated or disaggregated engine, KV tiers, or upstream engines."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.metrics import Metrics, TierMetrics
from gateway.upstream.metrics import UpstreamMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "configs" / "grafana" / "agentserve.json"
SERIES_SUFFIXES = ("_bucket", "_count", "_sum")


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry)
    TierMetrics.register(registry)
    UpstreamMetrics(registry)
    names = set()
    for family in registry.collect():  # a labelled family has no sample until a label is used: name it by type
        suffixes = {"counter": ("_total",), "histogram": SERIES_SUFFIXES}.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def test_every_panel_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 20
    for expression in expressions:
        for name in re.findall(r"agentserve:[a-z_]+", expression):
            assert name in exported, name


def test_it_covers_latency_kv_roles_and_fallbacks() -> None:
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"Time to first token", "Time per output token", "KV cache hit ratio", "Role split",
            "Role moves and alerts", "KV transfers and fallbacks"} <= titles
