"""Tune on one part of a trace, report on another: the trace's first half picks the fixed LFU's decay; the
second half, replayed from an empty cache, gives every figure the report shows (the adaptive policy tunes
itself as it goes, so it is simply replayed on the second half too)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from agents_eval.bench.kv_cache.replay import replay
from engine.kv_cache.policy import EvictionPolicy, LfuWeights, PolicyName, make_policy
from predictor.traces import TraceRequest


def halves(requests: Sequence[TraceRequest]) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """The first and the second half of the requests, in trace order (by count)."""
    middle = len(requests) // 2
    return list(requests[:middle]), list(requests[middle:])


def tune_decay(requests: Sequence[TraceRequest], weights: LfuWeights, decays_s: Sequence[float],
               sizes: Sequence[int]) -> tuple[float, dict[float, dict[int, float]]]:
    """The LFU decay with the best mean hit ratio over `sizes` on `requests`, and every decay's ratios."""
    ratios = {decay: {size: replay(requests, make_policy("lfu", replace(weights, decay_s=decay)), size).ratio
                      for size in sizes} for decay in decays_s}
    best = max(decays_s, key=lambda decay: statistics.fmean(ratios[decay].values()))
    return best, ratios


def policy_for(name: PolicyName, weights: LfuWeights, size: int) -> EvictionPolicy:
    return make_policy(name, weights, capacity=size)
