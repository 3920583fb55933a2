"""The gateway benchmark end to end at a tiny size: report keys, both per-turn curves, and the CLI entry."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents_eval.bench.gateway import steps as bench_steps
from agents_eval.bench.gateway.bench import BenchResult, GatewayBenchSettings, run_benchmark
from agents_eval.bench.gateway.client import CHAT, WS
from agentserve.cli import EXIT_BAD_INPUT, main
from engine.config import EngineSettings
from trajectory import step_timer

SETTINGS = GatewayBenchSettings(model="tiny", requests=4, concurrency=(1, 4), rounds=1, turns=3, sessions=1)
ENGINE_SETTINGS = EngineSettings(num_kv_blocks=512)
REPORT_KEYS = {"settings", "engine_settings", "machine", "model_config", "overhead", "session", "goal",
               "bench_wall_s", "load_average_at_end"}
STEPS_SEEN = {"parse", "session_load", "render_tokenize", "plan", "admit", "engine", "metrics", "outputs",
              "serialize", "session_save", "send", "other"}
QUANTILE_KEYS = {"engine_ms", "gateway_ms", "gateway_server_ms", "overhead_ms", "overhead_in_app_ms",
                 "client_and_socket_ms"}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(SETTINGS, tmp_path_factory.mktemp("gateway-bench"), ENGINE_SETTINGS)


@pytest.mark.slow
def test_report_holds_overhead_per_concurrency_level(result: BenchResult) -> None:
    report = json.loads(result.files.json.read_text())
    assert report.keys() >= REPORT_KEYS
    levels = report["overhead"]["levels"]
    assert set(levels) == {"c1", "c4"} and set(report["goal"]["met"]) == {"c1", "c4"}
    for level in levels.values():
        assert level["p50"].keys() == level["p99"].keys() == QUANTILE_KEYS
        assert level["samples"] == SETTINGS.requests
        assert level["same_completion_tokens"]
        assert level["tokens"]["engine"]["cached"] == level["tokens"]["gateway"]["cached"] == 0
        steps = level["steps"]
        assert steps["requests"] == SETTINGS.requests * SETTINGS.rounds
        assert set(steps["steps"]) >= STEPS_SEEN and steps["steps"]["engine"]["share"] is None
        assert sum(f["share"] for f in steps["steps"].values() if f["share"] is not None) == pytest.approx(1.0)
        assert level["gateway_cpu_s_per_request"] > 0
    assert report["overhead"]["client_floor"]["requests"] > 0
    assert "## Gateway time per chat request, by step (inside the server)" in result.markdown


@pytest.mark.slow
def test_both_per_turn_curves_have_one_point_a_turn(result: BenchResult) -> None:
    session = json.loads(result.files.json.read_text())["session"]
    for mode in (WS, CHAT):
        for key in ("turn_latency_ms", "prompt_tokens", "cached_tokens", "prefilled_tokens", "output_tokens"):
            assert len(session[mode][key]) == SETTINGS.turns, (mode, key)
        assert session[mode]["cached_tokens"][0] == 0  # every session starts cold
        assert len(session[mode]["sessions_latency_ms"]) == SETTINGS.sessions
    assert session[WS]["cached_tokens"][-1] > 0
    assert session["chat_over_ws"].keys() == {"mean_ms", "p50_ms", "last_turn_ms"}
    markdown = result.files.markdown.read_text()
    assert "## Agent session: per-turn latency" in markdown and "| chat / WebSocket |" in markdown
    assert result.files.chart.name == "turn_latency.png"
    assert result.files.chart.read_bytes().startswith(b"\x89PNG")


def test_cli_rejects_zero_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "gateway", "--out", str(tmp_path), "--turns", "0"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == "agentserve: error: --turns must be at least 1"
    assert not any(tmp_path.iterdir())


def test_cli_rejects_a_session_longer_than_the_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "gateway", "--out", str(tmp_path), "--model", "tiny", "--turns", "40"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert "more than the model's context of 2048" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_step_wrappers_are_gone_after_the_step_waves() -> None:
    class Ledger:
        def check(self) -> str:
            return "class"

    ledger, metrics = Ledger(), Ledger()
    metrics.finished = lambda: "own"  # type: ignore[attr-defined]  # an instance's own callable
    state = SimpleNamespace(admission=ledger, metrics=metrics, signals=object())
    with bench_steps.instrumented(state):  # type: ignore[arg-type]
        assert "check" in vars(ledger) and ledger.check() == "class"
        times = step_timer.timing("other")
        metrics.finished()  # type: ignore[attr-defined]
        assert "metrics" in times.finish()
    assert "check" not in vars(ledger) and metrics.finished() == "own"  # type: ignore[attr-defined]


def test_the_heap_frozen_for_the_run_is_unfrozen_after_it(result: BenchResult) -> None:
    assert gc.get_freeze_count() == 0
