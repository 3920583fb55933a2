"""The one percentile definition (linear interpolation, numpy's default) and the figures built on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents_eval.harness import stats


def test_percentiles_interpolate_between_ranks() -> None:
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert stats.percentile([7.0], 99) == 7.0
    assert math.isnan(stats.percentile([], 50))
    summary = stats.quantiles([float(v) for v in range(1, 101)])
    assert summary["p50"] == pytest.approx(50.5) and summary["p90"] == pytest.approx(90.1)
    assert summary["p99"] == pytest.approx(99.01) and summary["mean"] == pytest.approx(50.5)


def test_tpot_is_the_gap_between_tokens_after_the_first() -> None:
    assert stats.tpot(0.1, 1.0, 10) == pytest.approx(0.1)
    assert stats.tpot(0.1, 1.0, 1) is None
    assert stats.tpot(None, 1.0, 10) is None


def test_the_percentile_is_numpys_default_on_any_sample() -> None:
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 100):
        values = rng.exponential(size=size).tolist()
        for q in (0, 50, 90, 99, 100):
            assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_a_summary_scales_to_the_unit_asked_for() -> None:
    summary = stats.summary([0.001, 0.002, 0.003], scale=1000.0)
    assert summary["p50"] == pytest.approx(2.0) and summary["count"] == 3.0
