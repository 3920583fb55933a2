"""Per-tier metrics from a real engine's tiers, through the Prometheus text and back (as the monitor reads it)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.settings import KVCacheSettings
from engine.kv_cache.tiers.chain import TierStats
from engine.kv_cache.tiers.engine import total_tier_stats
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
    ratios = {dict(s.labels)["tier"]: s.value for s in scrape.samples[f"{PREFIX}kvcache_hit_ratio"]}
    assert ratios["host"] == host["hits"] / host["queries"] > 0 and set(ratios) == {"host", "disk"}
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


def test_workers_tier_counters_sum_and_their_bandwidths_average() -> None:
    """A disaggregated engine's total: counts summed per tier, a tier only one worker has kept, bandwidth
    averaged over the workers that measured it."""
    def part(host_hits: int, loaded: int, bandwidth: dict[str, float], disk: bool) -> dict[str, Any]:
        tiers = {"host": asdict(TierStats(queries=2 * host_hits, hits=host_hits, demoted=3, blocks=1, bytes=10))}
        if disk:
            tiers["disk"] = asdict(TierStats(queries=1, hits=1, promoted=1))
        return {"tiers": tiers, "loaded": loaded, "recomputed": 1, "bytes_per_s": bandwidth,
                "prefetch": {"scheduled": 2, "started": 1}}

    total = total_tier_stats([part(4, 5, {"host": 100.0, "disk": 10.0}, True), part(1, 2, {"host": 300.0}, False)])
    assert total is not None
    assert total["tiers"]["host"] == asdict(TierStats(queries=10, hits=5, demoted=6, blocks=2, bytes=20))
    assert total["tiers"]["disk"] == asdict(TierStats(queries=1, hits=1, promoted=1))
    assert (total["loaded"], total["recomputed"]) == (7, 2)
    assert total["bytes_per_s"] == {"host": 200.0, "disk": 10.0}
    assert total["prefetch"] == {"scheduled": 4, "started": 2}
    assert total_tier_stats([]) is None
