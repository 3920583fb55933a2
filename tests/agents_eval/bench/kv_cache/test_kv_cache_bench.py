"""`bench kv-cache` on a hand-built Mooncake-format trace (figures computed by hand) and on the head of
the shipped trace (invariants every replay must keep)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.kv_cache import run_benchmark
from agents_eval.bench.kv_cache.engine_replay import multi_turn, replay_on_engine
from agents_eval.bench.kv_cache.replay import replay, unbounded
from agents_eval.bench.kv_cache.settings import KVCacheBenchSettings
from engine.kv_cache.policy import LfuPolicy, LfuWeights, LruPolicy
from predictor.traces import DEFAULT_TRACE, TraceRequest, load_trace

# (timestamp ms, hash ids): unbounded, the hits are 0, 3, 1, 4 of 3, 4, 2, 5 blocks
HAND_TRACE = [(0, [0, 1, 2]), (1000, [0, 1, 2, 3]), (2000, [0, 4]), (3000, [0, 1, 2, 3, 5])]


def write_trace(path: Path) -> Path:
    """The hand trace twice, its second copy 10 s later: the bench tunes on the first, reports on the second."""
    twice = [(t, ids) for t, ids in HAND_TRACE] + [(t + 10_000, ids) for t, ids in HAND_TRACE]
    lines = [json.dumps({"timestamp": t, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids})
             for t, ids in twice]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_report_on_a_hand_built_trace(tmp_path: Path) -> None:
    settings = KVCacheBenchSettings(trace=write_trace(tmp_path / "trace.jsonl"), cache_blocks=(2, 100),
                                    configured_blocks=100)
    report = run_benchmark(settings, tmp_path / "out")
    assert report["bound"] == pytest.approx(8 / 14)
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["bound"] == pytest.approx(8 / 14)
    assert saved["requests"] == len(HAND_TRACE) and "second half" in saved["split"]["reported_on"]
    assert saved["tuning"]["decay_s"] in settings.tune_decays_s
    for policy in ("adaptive", "lfu", "lru"):
        assert saved["hit_ratio"][policy]["100"] == pytest.approx(8 / 14)  # room for all: the bound
        assert saved["hit_ratio"][policy]["2"] < 8 / 14
    margin, at_configured = saved["goals"]
    assert set(margin) == {"name", "target", "bound", "measured", "met"}
    assert margin["measured"] == pytest.approx(min(saved["hit_ratio"]["adaptive"][s] - saved["hit_ratio"]["lru"][s]
                                                   for s in ("2", "100")))
    assert at_configured["measured"] == pytest.approx(1.0) and at_configured["met"] is True
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| 100 (configured) |" in markdown and (tmp_path / "out" / "hit_ratio.png").stat().st_size > 0
    assert "first half" in markdown


def test_a_two_block_cache_keeps_a_shared_head_under_lfu_only() -> None:
    """Block 10 heads a chain; two one-block requests pass. LRU evicts 10 as the least recent; LFU scores it
    with its child's access too and evicts block 12 instead, so the last request hits."""
    requests = [TraceRequest(t, 0, 0, ids) for t, ids in ((0, (10, 11)), (1000, (12,)), (2000, (13,)), (3000, (10,)))]
    assert replay(requests, LfuPolicy(LfuWeights(decay_s=1e6)), 2).hits == 1
    assert replay(requests, LruPolicy(), 2).hits == 0


def test_a_request_longer_than_the_cache_leaves_its_tail_uncached() -> None:
    requests = [TraceRequest(0, 0, 0, (1, 2, 3, 4)), TraceRequest(1, 0, 0, (1, 2, 3, 4))]
    for policy in (LfuPolicy(), LruPolicy()):
        assert replay(requests, policy, 2).hits == 2  # blocks 1 and 2 stayed


def test_replays_of_the_shipped_trace_stay_under_the_bound() -> None:
    requests = load_trace(DEFAULT_TRACE, 400)
    bound = unbounded(requests).ratio
    lru = [replay(requests, LruPolicy(), size).ratio for size in (500, 2000, 8000)]
    lfu = [replay(requests, LfuPolicy(), size).ratio for size in (500, 2000, 8000)]
    assert 0 < bound < 1 and all(r <= bound for r in lru + lfu)
    assert lru == sorted(lru)  # LRU is a stack algorithm: a bigger cache never hits less


def test_engine_replay_loads_reused_blocks_from_the_tiers() -> None:
    requests = multi_turn(load_trace(DEFAULT_TRACE, 2000), 16)
    assert len({len(r.hash_ids) for r in requests}) > 1 and len(requests) >= 16
    replay = replay_on_engine(requests, device_blocks=48, host_blocks=32)
    promoted = sum(tier["promoted"] for tier in replay["tiers"].values())
    assert replay["loaded"] == promoted > 0 and replay["cached_tokens"] > 0
    assert set(replay["bytes_per_s"]) <= {"host", "disk"} and replay["tiers"]["host"]["demoted"] > 0


@pytest.mark.slow
def test_the_configured_policy_meets_the_goals_on_the_held_out_half(tmp_path: Path) -> None:
    """The issue's goals with configs/engine.yaml's policy at the default sizes, on the trace's second half (the
    first tunes the fixed LFU's decay): at least LRU's hit ratio at every size, and 95% of the bound at the
    configured size; the smaller sizes cannot hold the half."""
    settings = KVCacheBenchSettings()
    report = run_benchmark(settings, tmp_path)
    assert settings.configured_blocks < report["distinct_blocks"]
    assert [g["name"] for g in report["goals"] if not g["met"]] == [], (report["goals"], report["hit_ratio"])
