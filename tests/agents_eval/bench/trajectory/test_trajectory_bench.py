"""The trajectory benchmark end to end, small: report files and keys, turn-delta prefill below full recompute
and below prefix caching without pins, trace sessions and reuse, pruning per type, and phase-shift events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.trajectory.bench import BenchResult, TrajectoryBenchSettings, run_benchmark
from agents_eval.bench.trajectory.synthetic_outputs import KINDS
from agentserve.cli import EXIT_BAD_INPUT, main
from engine.config import EngineSettings
from predictor.traces import TraceRequest, sessions_and_reuse

SETTINGS = TrajectoryBenchSettings(model="tiny", sessions=2, turns=4, max_requests=20, pruning_samples=3,
                                   phase_segment_s=10.0, num_threads=1)
ENGINE_SETTINGS = EngineSettings(num_kv_blocks=1024, block_size=16)
REPORT_KEYS = {"settings", "engine_settings", "model_config", "machine", "synthetic", "kv_bytes", "trace",
               "pruning", "phase", "bench_wall_s"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(SETTINGS, tmp_path_factory.mktemp("trajectory-bench"), ENGINE_SETTINGS)


@pytest.mark.slow
def test_report_files_hold_every_section(result: BenchResult) -> None:
    report = json.loads(result.files.json.read_text())
    assert report.keys() >= REPORT_KEYS
    assert report["settings"]["sessions"] == 2 and report["machine"]["torch_threads"] == 1
    assert report["synthetic"]["turns_run"] == [4, 4]
    markdown = result.files.markdown.read_text()
    assert "| turn-delta reuse (prefix caching and session KV pin) |" in markdown
    assert "| measured: prefix caching on, no session pin |" in markdown
    assert "arrival timestamps are not honoured" in markdown
    for chart in (result.per_turn_chart, result.files.chart):
        assert chart.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_turn_delta_prefills_less_than_full_recompute(result: BenchResult) -> None:
    synthetic = result.report["synthetic"]
    assert synthetic["prefill_tokens_turn_delta"] < synthetic["prefill_tokens_full_recompute"]
    assert synthetic["measured_no_cache_equals_full_recompute"]
    full, delta = synthetic["per_turn"]["full_recompute"], synthetic["per_turn"]["turn_delta"]
    assert len(full) == len(delta) == 4 and all(d < f for d, f in zip(delta[1:], full[1:], strict=True))
    kv = result.report["kv_bytes"]
    assert kv["snapshot_per_turn_bytes_mean"] > kv["turn_delta_bytes_mean"] > 0


@pytest.mark.slow
def test_pins_are_credited_only_over_prefix_caching(result: BenchResult) -> None:
    synthetic = result.report["synthetic"]
    per_turn = synthetic["per_turn"]
    full, cached, delta = per_turn["full_recompute"], per_turn["prefix_caching"], per_turn["turn_delta"]
    assert per_turn["measured_no_cache"] == full and len(cached) == 4
    assert all(d <= c < f for d, c, f in zip(delta[1:], cached[1:], full[1:], strict=True))
    assert sum(delta[1:]) < sum(cached[1:])  # a pin holds the partly filled last block too; caching only full ones
    assert synthetic["prefill_tokens_prefix_caching"] == sum(cached)
    assert synthetic["reduction_over_prefix_caching"] == pytest.approx(sum(cached) / sum(delta))
    assert synthetic["reduction"] == pytest.approx(sum(full) / sum(delta))
    assert synthetic["reduction"] > synthetic["reduction_over_prefix_caching"]
    assert synthetic["prefix_caching_reduction"] == pytest.approx(sum(full) / sum(cached))


@pytest.mark.slow
def test_trace_replay_with_prefix_caching_computes_at_most_as_much(result: BenchResult) -> None:
    trace = result.report["trace"]
    on, off = trace["prefix_caching_on"], trace["prefix_caching_off"]
    assert trace["requests"] == 20 and on["prompt_tokens"] == off["prompt_tokens"] == trace["prompt_tokens"]
    assert off["computed_tokens"] == off["prompt_tokens"] and off["hit_ratio"] is None
    assert on["computed_tokens"] == on["prompt_tokens"] - on["hits"]
    assert 0 < on["hit_ratio"] <= trace["hit_ratio_upper_bound"]


@pytest.mark.slow
def test_pruning_is_reported_per_type_and_json_stays_whole(result: BenchResult) -> None:
    pruning = result.report["pruning"]
    assert list(pruning) == list(KINDS)
    assert all(f["tokens_after"] <= f["tokens_before"] for f in pruning.values())
    assert pruning["json"]["removed_share"] == 0 and pruning["log"]["removed_share"] > 0


@pytest.mark.slow
def test_phase_swings_are_detected(result: BenchResult) -> None:
    phase = result.report["phase"]
    assert len(phase["events"]) >= 1
    assert {d["direction"] for d in phase["detections"] if d["detected_s"] is not None} <= {"to_act", "to_think"}


def test_a_request_extending_an_earlier_ones_full_blocks_continues_its_session() -> None:
    hash_ids = [(0, 1, 2), (0, 5), (0, 1, 7, 8, 9), (0, 5, 6), (0, 9)]
    sessions, reused = sessions_and_reuse([TraceRequest(0, 512 * len(ids), 10, ids) for ids in hash_ids])
    assert sessions == [0, 1, 0, 1, 2]  # sharing only the first block (every request's) starts a session
    assert reused == [0, 1, 2, 2, 1]


def test_cli_rejects_a_missing_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "trajectory", "--out", str(tmp_path / "out"), "--trace", str(missing)])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"agentserve: error: trace not found: {missing} (pass --trace)"
