"""The sparse-history benchmark end to end on the tiny model: every shape and variant timed, the goal reported
in the common shape (its value is a measurement, not asserted here)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from agents_eval.bench.sparse import SparseBenchSettings, run_benchmark
from agents_eval.bench.sparse.measure import skipped_blocks


def test_quick_run_times_every_variant_and_reports_the_goal(tmp_path: Path) -> None:
    settings = replace(SparseBenchSettings.quick(), contexts=(1024,), batches=(1, 3), decode_repeats=1,
                       prefill_repeats=1)
    report = run_benchmark(settings, tmp_path)
    decodes = [c for c in report["cases"] if c["new_tokens"] == 1]
    prefills = [c for c in report["cases"] if c["new_tokens"] == settings.prefill_tokens]
    assert len(decodes) == len(prefills) == 2
    assert set(decodes[0]["timings"]) == {"skip_0", "skip_0.5", "skip_0.75", "skip_one_block", "query_refresh"}
    assert "query_amortized" in decodes[0]["speedup_over_dense"] and "query_refresh" not in prefills[0]["timings"]
    assert decodes[0]["skipped_share"]["skip_0.5"] == 0.5
    [goal] = report["goals"]
    assert set(goal) == {"name", "target", "bound", "measured", "met"} and "batch 3, 1024 tokens" in goal["name"]
    assert goal["met"] == (goal["measured"] >= goal["target"])
    assert json.loads((tmp_path / "report.json").read_text())["goals"] == report["goals"]
    assert "Decode step" in (tmp_path / "report.md").read_text() and (tmp_path / "speedup.png").stat().st_size > 0


def test_skipped_blocks_spare_the_first_block_and_the_recent_window() -> None:
    blocks = skipped_blocks(6144, 16, 0.75, seed=0)
    assert len(blocks) == 288 and 0 not in blocks and max(blocks) < 384 - 16
    assert blocks == skipped_blocks(6144, 16, 0.75, seed=0)
