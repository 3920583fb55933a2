"""`agentserve bench --workload`: the figures on hand-built records, and short end-to-end runs of real gateways
on the `tiny` model (the harness's client, driver and stats have their own tests in tests/agents_eval/harness)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.bench.agent import metrics as metrics
from agents_eval.bench.agent.bench import AgentBenchSettings, BenchResult, run_benchmark
from agents_eval.bench.agent.configs import CONFIGS
from agents_eval.bench.agent.report.report import config_ratios, goal_check
from agents_eval.bench.agent.run import RunOptions
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload
from agents_eval.harness import stats
from agents_eval.harness.drive import RunLimits
from agents_eval.harness.servers.gateway import COUNTERS, counter_deltas, parse_metrics
from agents_eval.harness.stats import RequestRecord, Slo
from agentserve.cli import EXIT_BAD_INPUT, main

SLO = Slo(ttft_s=1.0, tpot_s=0.2)
PNG = b"\x89PNG"
CONFIG_KEYS = {"throughput_rps", "p99_latency_s", "p50_latency_s", "cost_per_1k_tokens", "slo_attainment",
               "goodput_rps", "output_tokens_per_s", "latency", "requests_sent", "errors", "kv_hit_ratio",
               "prefix_hit_ratio", "prefill_tokens", "pruned_tokens", "masked_tokens", "workers", "split",
               "role_timeline", "window_s", "cores", "gpus", "cost_usd", "cost_per_1k_output_tokens",
               "cost_per_1k_prompt_tokens", "computed_prompt_tokens"}
PLOTS = ("throughput_vs_rate.png", "goodput_vs_rate.png", "attainment_vs_rate.png", "latency_cdf.png",
         "ttft_cdf.png", "role_timeline.png")


def record(sent: float, ttft: float | None, e2e: float, tokens: int, error: str | None = None) -> RequestRecord:
    return RequestRecord("s", 0, "act", sent, ttft, e2e, 100, 40, tokens, error)


def test_slo_attainment_and_goodput_count_failures_as_misses() -> None:
    records = [
        record(0.0, 0.5, 1.4, 10),  # TPOT 0.1: meets both
        record(1.0, 1.5, 2.0, 10),  # TTFT over
        record(2.0, 0.2, 4.2, 11),  # TPOT 0.4 over
        record(3.0, None, 1.0, 0, error="HTTP 500"),
        record(4.0, 0.3, 1.0, 1),  # one token: TTFT only
    ]
    assert [stats.meets_slo(r, SLO) for r in records] == [True, False, False, False, True]
    assert stats.slo_attainment(records, SLO) == pytest.approx(2 / 5)
    assert stats.measured_window_s(records) == pytest.approx(6.2)  # 0.0 to 2.0 + 4.2
    summary = metrics.summarize(records, SLO, deltas=dict.fromkeys(COUNTERS, 0.0))
    assert summary["requests_sent"] == 5 and summary["requests_ok"] == 4 and summary["errors"] == 1
    assert summary["throughput_rps"] == pytest.approx(4 / 6.2)
    assert summary["goodput_rps"] == pytest.approx(2 / 6.2)
    assert summary["output_tokens_per_s"] == pytest.approx(32 / 6.2)
    assert summary["p99_latency_s"] == pytest.approx(stats.percentile([1.4, 2.0, 4.2, 1.0], 99))
    assert (summary["prompt_tokens"], summary["cached_tokens"]) == (400, 160)


EXPOSITION = """\
# TYPE agentserve:prompt_tokens_total counter
agentserve:prompt_tokens_total 1000.0
# TYPE agentserve:cached_tokens_total counter
agentserve:cached_tokens_total 600.0
# TYPE agentserve:prefix_cache_queries_total counter
agentserve:prefix_cache_queries_total 800.0
# TYPE agentserve:prefix_cache_hits_total counter
agentserve:prefix_cache_hits_total 200.0
# TYPE agentserve:pruned_tokens_total counter
agentserve:pruned_tokens_total 30.0
# TYPE agentserve:num_workers gauge
agentserve:num_workers{role="prefill"} 1.0
agentserve:num_workers{role="decode"} 3.0
agentserve:num_workers{role="colocated"} 0.0
"""


def test_metrics_deltas_give_hit_ratios_and_prefilled_tokens() -> None:
    after = parse_metrics(EXPOSITION)
    assert after["workers"] == {"prefill": 1, "decode": 3}
    before = dict.fromkeys(COUNTERS, 0.0) | {"prompt_tokens": 200.0, "cached_tokens": 100.0}
    figures = metrics.cache_figures(counter_deltas(before, after["counters"]))
    assert figures == {"prefix_hit_ratio": 0.25, "kv_hit_ratio": 500 / 800, "prefill_tokens": 300.0,
                       "pruned_tokens": 30.0, "masked_tokens": 0.0}


def test_ratios_are_quotients_and_goal_shortfalls_are_factors() -> None:
    figures = {"throughput_rps": 2.0, "goodput_rps": 1.0, "p99_latency_s": 4.0, "cost_per_1k_output_tokens": 0.5}
    agent = {"throughput_rps": 5.0, "goodput_rps": 5.0, "p99_latency_s": 1.0, "cost_per_1k_output_tokens": 0.1}
    ratios = config_ratios({"baseline": figures, "agent": agent})
    assert ratios == {"agent/baseline": {"throughput": 2.5, "goodput": 5.0, "p99_latency": 0.25,
                                         "cost": pytest.approx(0.2)}}
    checks = {c["figure"]: c for c in goal_check(ratios)}  # agent/disaggregated not measured: no check
    assert set(checks) == {"throughput", "p99_latency", "cost"}
    assert not checks["throughput"]["met"] and checks["throughput"]["shortfall"] == pytest.approx(5.0 / 2.5)
    assert checks["throughput"]["measured_as"] == "throughput" and checks["throughput"]["against"] == "baseline"
    assert not checks["p99_latency"]["met"] and checks["p99_latency"]["shortfall"] == pytest.approx(0.25 / 0.2)
    assert checks["cost"]["met"]


def test_bench_without_kind_or_workload_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--workload" in err


def test_bench_workload_needs_an_out_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--workload", "swe"])
    assert exit_info.value.code == EXIT_BAD_INPUT and "--out" in capsys.readouterr().err


END_TO_END = AgentBenchSettings(
    WorkloadOptions("swe", seed=1, rate=1.0, duration_s=20.0, max_requests=10),
    run=RunOptions("tiny", "ws", RunLimits(duration_s=20.0, max_requests=10, request_timeout_s=60.0,
                                           drain_timeout_s=30.0), warm_up_turns=2),
    slo=Slo(ttft_s=5.0, tpot_s=1.0))


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> BenchResult:
    return run_benchmark(END_TO_END, tmp_path_factory.mktemp("agent-bench"))


@pytest.mark.slow
def test_every_configuration_has_sane_figures(bench: BenchResult) -> None:
    report = json.loads(bench.files.json.read_text())
    assert set(report["configurations"]) == {"baseline", "disaggregated", "agent"}
    for name, config in report["configurations"].items():
        assert config.keys() >= CONFIG_KEYS, name
        assert config["errors"] == 0 and config["session_errors"] == [], name
        assert config["requests_sent"] == config["requests_ok"] == 10, name
        assert config["throughput_rps"] > 0 and config["output_tokens_per_s"] > 0, name
        assert 0 <= config["slo_attainment"] <= 1 and config["cost_per_1k_output_tokens"] > 0, name
        assert config["cores"] == report["settings"]["colocated_threads"] and config["gpus"] == 0, name
        for figure in ("ttft", "tpot", "e2e"):
            quantiles = config["latency"][figure]
            assert 0 < quantiles["p50"] <= quantiles["p90"] <= quantiles["p99"], (name, figure)
    assert report["settings"]["colocated_threads"] >= 1 and "machine" in report
    sources = {name: config["split_source"] for name, config in report["configurations"].items()}
    assert set(sources.values()) == {"/admin/capacity"}  # the baseline's engines are worker processes too
    deployments = {name: config["deployment"] for name, config in report["configurations"].items()}
    assert deployments["baseline"]["processes"] == deployments["agent"]["processes"] == 2
    assert deployments["baseline"]["prefix_caching"] and not deployments["baseline"]["sessions"]
    assert all(len(turns) >= 1 for turns in report["configurations"]["baseline"]["prompt_tokens_per_turn"].values())
    assert report["settings"]["mode"] == "fixed-rate"
    assert "slo_rate_sessions_per_s" not in report["configurations"]["agent"]


@pytest.mark.slow
def test_the_gateway_counted_what_the_client_sent(bench: BenchResult) -> None:
    """Every request the client recorded reached the gateway once, and each reply had exactly the
    `max_output_tokens` its turn asked for (ignore_eos)."""
    for point in bench.points:
        records = point.result.records
        assert point.result.deltas["prompt_tokens"] == sum(r.prompt_tokens for r in records), point.config
        assert point.result.deltas["generation_tokens"] == sum(r.output_tokens for r in records), point.config
    workload = build_workload(END_TO_END.workload, "tiny", END_TO_END.workload.rate)
    asked = {(s.session_id, i): turn.max_output_tokens for s in workload.sessions for i, turn in enumerate(s.turns)}
    for point in bench.points:
        assert all(r.output_tokens == asked[r.session_id, r.turn] for r in point.result.records), point.config


@pytest.mark.slow
def test_pruning_and_masks_engage_where_they_are_on(bench: BenchResult) -> None:
    """The swe workload's observations are tool output with redundancy, and its first session outlives the
    observations masks keep visible: the agent run reports tokens pruned and masked, the others none."""
    report = json.loads(bench.files.json.read_text())
    for name, config in report["configurations"].items():
        engaged = CONFIGS[name].pruning
        assert (config["pruned_tokens"] > 0, config["masked_tokens"] > 0) == (engaged, engaged), name
    assert "with pruning and masks on" not in bench.files.markdown.read_text()  # no note of idle pruning


@pytest.mark.slow
def test_ratios_are_the_configs_quotients(bench: BenchResult) -> None:
    report = json.loads(bench.files.json.read_text())
    configs, ratios = report["configurations"], report["ratios"]
    for top, bottom in (("agent", "baseline"), ("disaggregated", "baseline"), ("agent", "disaggregated")):
        quotient = ratios[f"{top}/{bottom}"]
        for short, key in (("throughput", "throughput_rps"), ("p99_latency", "p99_latency_s"),
                           ("cost", "cost_per_1k_output_tokens")):
            assert quotient[short] == pytest.approx(configs[top][key] / configs[bottom][key]), (top, short)
    assert {(c["config"], c["against"], c["figure"]) for c in report["goal"]} == {
        ("agent", "baseline", "throughput"), ("agent", "baseline", "p99_latency"), ("agent", "baseline", "cost"),
        ("agent", "disaggregated", "throughput")}


@pytest.mark.slow
def test_markdown_table_and_plots(bench: BenchResult) -> None:
    markdown = bench.files.markdown.read_text()
    assert ("| configuration | throughput (req/s) | p99 latency | cost ($/1k generated tokens) | cost ($/1k computed "
            "prompt tokens) |") in markdown
    for label in ("colocated engines with prefix caching", "disaggregated (DistServe)", "agent-optimized",
                  "agent/baseline", "## Goal check"):
        assert label in markdown
    for plot in PLOTS:
        assert (bench.files.json.parent / plot).read_bytes().startswith(PNG), plot
    for point in bench.points:
        lines = (bench.files.json.parent / "requests" / f"{point.config}-x1.jsonl").read_text().splitlines()
        assert len(lines) == len(point.result.records) and json.loads(lines[0]).keys() >= {"sent_at_s", "ttft_s"}


@pytest.mark.slow
def test_webarena_through_chat_sessions_from_the_cli(tmp_path: Path) -> None:
    main(["bench", "--workload", "webarena", "--configs", "agent", "--client", "http", "--duration", "15",
          "--rate", "1", "--max-requests", "6", "--warm-up-turns", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    agent = report["configurations"]["agent"]
    assert report["workload"]["name"] == "webarena" and report["settings"]["client"] == "http"
    assert agent["requests_sent"] == agent["requests_ok"] == 6 and agent["errors"] == 0
    assert agent["kv_hit_ratio"] > 0  # every session shares the instruction prefix
    assert report["ratios"] == {} and "no baseline" in (tmp_path / "report.md").read_text()
