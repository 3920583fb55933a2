"""The engine benchmark end to end on the built-in tiny model: report files, figures, and parity of the
`transformers` baselines' greedy tokens with our engine's (which proves the weight transfer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.engine.bench import BenchResult, BenchSettings, run_benchmark
from agents_eval.bench.engine.report import BATCHED_KEY, ENGINE_KEY, SEQUENTIAL_KEY
from agentserve.cli import EXIT_BAD_INPUT, main
from engine.config import EngineSettings

SETTINGS = BenchSettings(model="tiny", num_requests=5, min_input=8, max_input=40, min_output=3, max_output=9,
                         hf_batch_size=2, prefix_prompt_len=64, prefix_repeats=2, num_threads=1)
ENGINE_SETTINGS = EngineSettings(num_kv_blocks=256, block_size=16, max_num_batched_tokens=64)
REPORT_KEYS = {"settings", "engine_settings", "model_config", "machine", "workload", ENGINE_KEY, SEQUENTIAL_KEY,
               BATCHED_KEY, "ratios", "prefix_cache", "bench_wall_s"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(SETTINGS, tmp_path_factory.mktemp("bench"), ENGINE_SETTINGS)


def test_report_files_hold_every_figure(result: BenchResult) -> None:
    report = json.loads(result.files.json.read_text())
    assert report.keys() >= REPORT_KEYS
    for key in (ENGINE_KEY, SEQUENTIAL_KEY, BATCHED_KEY):
        assert report[key]["output_tokens_per_s"] > 0 and report[key]["all_lengths_ok"]
        assert report[key]["output_tokens"] == report["workload"]["output_tokens"]
    assert report[BATCHED_KEY]["generated_tokens"] >= report[BATCHED_KEY]["output_tokens"]
    assert report["ratios"]["vs_hf_sequential"] > 0 and report["ratios"]["vs_hf_batched"] > 0
    assert report["machine"]["torch_threads"] == 1
    markdown = result.files.markdown.read_text()
    assert "| configuration | output tok/s | wall s |" in markdown and "HF generate (batch 1)" in markdown
    assert result.files.chart.read_bytes().startswith(b"\x89PNG")


def test_hf_baselines_generate_the_engines_greedy_tokens(result: BenchResult) -> None:
    runs = result.figures.runs
    lengths = [r.output_len for r in result.figures.workload]
    assert [len(t) for t in runs[ENGINE_KEY].tokens] == lengths
    assert runs[SEQUENTIAL_KEY].tokens == runs[ENGINE_KEY].tokens
    assert runs[BATCHED_KEY].tokens == runs[ENGINE_KEY].tokens
    assert result.report[SEQUENTIAL_KEY]["requests_matching_engine"] == SETTINGS.num_requests


def test_warm_prefix_cache_serves_all_full_blocks(result: BenchResult) -> None:
    prefix = result.report["prefix_cache"]
    block = ENGINE_SETTINGS.block_size
    assert prefix["cold_num_cached_tokens"] == 0
    assert prefix["num_cached_tokens"] == (SETTINGS.prefix_prompt_len - 1) // block * block
    assert len(prefix["cold_samples_s"]) == len(prefix["warm_samples_s"]) == SETTINGS.prefix_repeats


def test_cli_rejects_an_empty_length_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "engine", "--out", str(tmp_path), "--min-input", "50", "--max-input", "10"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == "agentserve: error: need 2 <= --min-input <= --max-input"
    assert not any(tmp_path.iterdir())


def test_cli_writes_the_report_and_prints_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AGENTSERVE_ENGINE_NUM_KV_BLOCKS", "256")
    main(["bench", "engine", "--out", str(tmp_path), "--model", "tiny", "--num-requests", "3", "--min-input", "8",
          "--max-input", "16", "--min-output", "2", "--max-output", "4", "--threads", "1", "--skip-hf-sequential"])
    report = json.loads((tmp_path / "report.json").read_text())
    assert SEQUENTIAL_KEY not in report and report["ratios"]["vs_hf_sequential"] is None
    assert report["engine_settings"]["num_kv_blocks"] == 256
    assert "| agentserve engine |" in capsys.readouterr().out
