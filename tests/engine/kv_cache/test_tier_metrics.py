"""Per-tier metrics from a real engine's tiers, through the Prometheus text and back (as the monitor reads it)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from engine.config import EngineSettings
from engine.kv_cache.settings import KVCacheSettings
from engine.llm_engine import LLMEngine
from engine.sampling import SamplingParams
from gateway.metrics import PREFIX, Metrics
from gateway.monitor import kv_tiers, parse_metrics, render

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def test_tier_counters_reach_the_metrics_and_the_monitor(tmp_path: Path) -> None:
    kv = KVCacheSettings(host_blocks=4, host_path=tmp_path / "host", disk_path=tmp_path / "disk")
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=12, block_size=4, kv_cache=kv))
    metrics = Metrics()
    metrics.sync_kv_tiers(engine.kv_tier_stats())
    for prompt in (list(range(3, 33)), list(range(500, 540)), list(range(3, 33))):
        engine.generate([prompt], GREEDY)
        metrics.sync_kv_tiers(engine.kv_tier_stats())  # cumulative totals become increments
    stats = engine.kv_tier_stats()
    assert stats is not None
    scrape = parse_metrics(metrics.render()[0].decode())
    tiers = kv_tiers(scrape)
    for tier in ("host", "disk"):
        counts = stats["tiers"][tier]
        assert tiers[tier]["demoted"] == counts["demoted"] and tiers[tier]["promoted"] == counts["promoted"]
        assert tiers[tier]["blocks"] == counts["blocks"] and tiers[tier]["bytes"] == counts["bytes"]
    assert stats["tiers"]["host"]["demoted"] > 0 and stats["tiers"]["disk"]["demoted"] > 0
    host = stats["tiers"]["host"]
    assert tiers["host"]["hit_ratio"] == host["hits"] / host["queries"]
    loaded = {dict(s.labels)["outcome"]: s.value for s in scrape.samples[f"{PREFIX}kvcache_load_decisions_total"]}
    assert loaded["loaded"] == stats["loaded"] > 0
    console = Console(width=160, record=True)
    console.print(render(scrape, "kvcache_hit_ratio"))
    shown = console.export_text()
    assert "KV tiers" in shown and f"blocks loaded {int(stats['loaded'])}, recomputed" in shown


def test_an_engine_without_tiers_exports_none() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=16, block_size=4))
    metrics = Metrics()
    metrics.sync_kv_tiers(engine.kv_tier_stats())
    assert engine.kv_tier_stats() is None
    assert kv_tiers(parse_metrics(metrics.render()[0].decode())) == {}
