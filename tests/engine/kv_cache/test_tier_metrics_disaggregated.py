"""A disaggregated engine's KV tier counters: each worker reports its own with its load, the engine sums them,
and the gateway's /metrics (and so `agentserve monitor`) shows them as it does a colocated engine's."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from engine.capacity.settings import CapacitySettings
from engine.config import EngineSettings
from engine.core.sampling.sampler import SamplingParams
from engine.kv_cache.settings import KVCacheSettings
from engine.workers.coordinator.worker_engine import WorkerEngine
from engine.workers.deployment import DeploymentSettings
from gateway.metrics import PREFIX
from gateway.monitor import Scrape, kv_tiers, parse_metrics, render
from gateway.server.app import create_app
from gateway.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.conftest import serving

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
ALWAYS_REMOTE = CapacitySettings(enabled=False, local_prefill_max_tokens=0, local_prefill_max_uncached_share=0)
# the first prompt again after a second one pushed it out of the prefill worker's 12 device blocks
PROMPTS = [list(range(3, 33)), list(range(500, 540)), list(range(3, 33))]


def start(tmp_path: Path, num_kv_blocks: int) -> WorkerEngine:
    """One prefill and one decode worker sharing a host tier (4 blocks each) over a disk tier."""
    kv = KVCacheSettings(host_blocks=4, host_path=tmp_path / "host", disk_path=tmp_path / "disk")
    settings = EngineSettings(num_kv_blocks=num_kv_blocks, block_size=4, kv_cache=kv)
    return WorkerEngine("tiny", settings, DeploymentSettings(transport="shm", kv_timeout_s=5.0), ALWAYS_REMOTE)


def test_the_engine_sums_its_workers_tier_counters(tmp_path: Path) -> None:
    engine = start(tmp_path, num_kv_blocks=12)
    try:
        assert engine.kv_tier_stats() is None  # no worker has reported yet
        for prompt in PROMPTS:
            engine.generate([prompt], GREEDY)  # returns once every worker has reported idle
        stats = engine.kv_tier_stats()
        parts = [w.kv_tiers for w in engine.workers if w.kv_tiers is not None]
    finally:
        engine.shutdown()
    assert stats is not None and len(parts) == 2
    host = stats["tiers"]["host"]
    assert host["demoted"] > 0 and host["hits"] > 0 and stats["tiers"]["disk"]["demoted"] > 0
    assert stats["loaded"] > 0
    for tier in ("host", "disk"):
        for counter in ("queries", "hits", "promoted", "demoted", "blocks", "bytes"):
            assert stats["tiers"][tier][counter] == sum(part["tiers"][tier][counter] for part in parts)
    assert stats["loaded"] == sum(part["loaded"] for part in parts)


def scrape_when(url: str, done: Callable[[Scrape], bool], timeout_s: float = 60.0) -> Scrape:
    """/metrics once `done(scrape)` holds (workers report with their load, not at once), or the last scrape."""
    deadline = time.monotonic() + timeout_s
    scrape = parse_metrics(httpx.get(f"{url}/metrics").text)
    while not done(scrape) and time.monotonic() < deadline:
        time.sleep(0.2)
        scrape = parse_metrics(httpx.get(f"{url}/metrics").text)
    return scrape


def test_gateway_metrics_and_monitor_show_a_disaggregated_engines_tiers(tmp_path: Path) -> None:
    settings = GatewaySettings(model="tiny", port=free_port(), default_max_tokens=4)
    app = create_app(settings, start(tmp_path, num_kv_blocks=16))
    first = "the agent lists the files of the repository and reads each one " * 2
    with serving(app, settings.port) as url:
        for text in (first, "then it runs the tests and the linter and reports what failed " * 2, first):
            body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4,
                    "temperature": 0}
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
        scrape = scrape_when(url, lambda s: kv_tiers(s).get("host", {}).get("hits", 0) > 0)
    tiers = kv_tiers(scrape)
    assert tiers["host"]["demoted"] > 0 and tiers["host"]["hits"] > 0 and tiers["disk"]["demoted"] > 0
    assert 0 < tiers["host"]["hit_ratio"] <= 1
    decisions = {dict(s.labels)["outcome"]: s.value for s in scrape.samples[f"{PREFIX}kvcache_load_decisions_total"]}
    assert decisions["loaded"] > 0
    console = Console(width=160, record=True)
    console.print(render(scrape, "kvcache_hit_ratio"))
    shown = console.export_text()
    assert "KV tiers" in shown and "host" in shown and "disk" in shown
