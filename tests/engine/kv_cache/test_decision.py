"""Load or recompute: bytes over the tier's measured bandwidth against tokens over the prefill rate."""

from __future__ import annotations

from engine.kv_cache.tiers.decision import LoadDecision


def test_load_decision_weighs_tier_bandwidth_against_prefill_rate() -> None:
    rate = 1000.0
    decision = LoadDecision(lambda: rate)
    assert decision.worth_loading("disk", 10**6, 16)  # not measured yet: load, and measure
    decision.observe("disk", 10**6, 1.0)  # 1 MB/s
    assert not decision.worth_loading("disk", 10**6, 16)  # 1 s to load against 16 ms to recompute
    assert decision.worth_loading("disk", 10**6, 2000)  # 2 s to recompute
    decision.load_speedup = 3.0  # load only when recomputing takes 3x longer
    assert not decision.worth_loading("disk", 10**6, 2000) and decision.worth_loading("disk", 10**6, 3000)
