"""`agentserve bench --workload` as DistServe measures throughput: the SLO-rate search on stub runners with a
known knee, cost from cores x hours with cached tokens excluded, the report built from a search, and one short
search through a real gateway."""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.progress import Progress

from agents_eval.bench.agent import run
from agents_eval.bench.agent.bench import AgentBenchSettings, assemble
from agents_eval.bench.agent.report.cost import CostSettings, Resources, cost_figures, engine_resources
from agents_eval.bench.agent.report.report import config_ratios, goal_check, write
from agents_eval.bench.agent.run import Point, PointResult, RunOptions
from agents_eval.bench.agent.search import slo as slo_module
from agents_eval.bench.agent.search.search import SearchOptions, SearchResult, search_in_turn, search_slo_rate
from agents_eval.bench.agent.search.slo import probe_limits
from agents_eval.bench.agent.settings import SearchSettings
from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.harness.drive import RunLimits, progress_display
from agents_eval.harness.servers.gateway import COUNTERS
from agents_eval.harness.stats import RequestRecord, Slo, slo_attainment
from agents_eval.workloads.types import APPEND, SessionScript, Turn, Workload
from agentserve.cli import main
from engine.config import CONFIGS_DIR

KNEE = 3.7


class Knee:
    """A runner whose SLO attainment is 1.0 below the knee and 0.5 at or above it; counts its runs."""

    def __init__(self, knee: float = KNEE) -> None:
        self.knee = knee
        self.rates: list[float] = []

    def __call__(self, rate: float) -> tuple[float, float]:
        self.rates.append(rate)
        return (1.0 if rate < self.knee else 0.5), rate


def test_search_finds_the_knee_within_precision_and_budget() -> None:
    runner = Knee()
    result = search_slo_rate(runner, 0.2, SearchOptions(growth=2.0, precision=0.05, max_probes=12))
    assert result.low is not None and result.high is not None
    assert result.low.rate < KNEE <= result.high.rate
    assert result.high.rate / result.low.rate - 1 <= 0.05 and result.converged(0.05)
    assert result.rate == result.low.rate
    # 0.2 .. 3.2 meet, 6.4 misses (6 probes), then 4 bisections take the bracket from 2x to 2^(1/16) = 1.044x
    assert len(result.probes) == len(runner.rates) == 10
    assert [p.rate for p in result.probes[:6]] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4])


def test_searches_in_turn_probe_what_each_would_alone_one_probe_of_each_a_round() -> None:
    """On a host whose speed drifts, the configuration searched last would meet its probes on another host: in
    turn, each round probes every search not yet done once, and each search still probes its own rates."""
    order: list[str] = []
    knees = {"baseline": 1.3, "disaggregated": 3.7, "agent": 9.0}
    runners = {name: Knee(knee) for name, knee in knees.items()}

    def logged(name: str) -> Callable[[float], tuple[float, float]]:
        def measure(rate: float) -> tuple[float, float]:
            order.append(name)
            return runners[name](rate)
        return measure

    options = SearchOptions(growth=2.0, precision=0.1, max_probes=9)
    results = search_in_turn({name: logged(name) for name in knees}, 0.2, options)
    for name, knee in knees.items():
        alone = Knee(knee)
        expected = search_slo_rate(alone, 0.2, options)
        assert [p.rate for p in results[name].probes] == runners[name].rates == alone.rates
        assert results[name].rate == expected.rate and results[name].high is not None
    assert order[:21] == ["baseline", "disaggregated", "agent"] * 7  # one probe of each per round...
    assert len(runners["baseline"].rates) == 7 and order[21:] == ["disaggregated", "agent"] * 2  # ...until done


@pytest.mark.parametrize(("knee", "probes", "probes_by_2"), [(5.0, 7, 8), (15.0, 8, 10), (50.0, 8, 11)])
def test_the_default_search_converges_knees_up_to_51_sessions_per_s_within_its_budget(
        knee: float, probes: int, probes_by_2: int) -> None:
    """x4 from 0.2 sessions/s brackets [12.8, 51.2) in 5 probes and bisects it to under 1.2x in 3 more; by x2 the
    climb alone takes 8, and a knee of 15 sessions/s took 10 probes, over the budget of 9."""
    runner = Knee(knee)
    result = search_slo_rate(runner, 0.2)
    assert result.converged(SearchOptions().precision) and len(runner.rates) == probes <= SearchOptions().max_probes
    assert result.low is not None and result.high is not None and result.low.rate < knee <= result.high.rate
    by_2 = Knee(knee)
    assert search_slo_rate(by_2, 0.2, SearchOptions(growth=2.0, max_probes=20)).rate == result.rate
    assert len(by_2.rates) == probes_by_2


def test_search_stops_at_the_probe_budget_with_the_bracket_it_has() -> None:
    runner = Knee()
    result = search_slo_rate(runner, 0.2, SearchOptions(growth=2.0, max_probes=6))
    assert len(runner.rates) == 6 and not result.converged(SearchOptions().precision)
    assert (result.rate, result.high and result.high.rate) == pytest.approx((3.2, 6.4))


def test_search_from_above_the_knee_shrinks_then_bisects() -> None:
    result = search_slo_rate(Knee(), 20.0, SearchOptions(growth=2.0, precision=0.1, max_probes=10))
    assert [p.rate for p in result.probes[:4]] == pytest.approx([20.0, 10.0, 5.0, 2.5])
    assert result.low is not None and result.high is not None
    assert result.low.rate < KNEE <= result.high.rate and result.converged(0.1)


def test_search_that_meets_the_slo_everywhere_stops_at_the_cap() -> None:
    always = Knee(knee=math.inf)
    result = search_slo_rate(always, 1.0, SearchOptions(growth=2.0, max_rate=5.0))
    assert always.rates == [1.0, 2.0, 4.0, 5.0]
    assert result.capped and result.high is None and result.rate == 5.0 and not result.converged(0.2)
    uncapped = search_slo_rate(Knee(knee=math.inf), 1.0, SearchOptions(growth=2.0, max_probes=4))
    assert uncapped.capped and uncapped.rate == 8.0 and len(uncapped.probes) == 4


def test_search_that_misses_at_the_lowest_rate_finds_none() -> None:
    never = Knee(knee=0.0)
    result = search_slo_rate(never, 1.0, SearchOptions(growth=2.0, min_rate=0.25))
    assert never.rates == [1.0, 0.5, 0.25]
    assert result.low is None and result.rate == 0.0 and not result.capped
    assert result.high is not None and result.high.rate == 0.25


def test_attainment_at_the_target_meets_it_and_nan_misses() -> None:
    exact = search_slo_rate(lambda rate: (0.9, None), 1.0, SearchOptions(growth=2.0, max_probes=2))
    assert exact.rate == 2.0 and exact.capped
    empty: SearchResult[None] = search_slo_rate(lambda rate: (math.nan, None), 1.0,
                                                SearchOptions(growth=2.0, max_probes=3))
    assert empty.rate == 0.0 and len(empty.probes) == 3
    with pytest.raises(ValueError, match="start rate"):
        search_slo_rate(Knee(), 0.0, SearchOptions(growth=2.0))


def test_cost_is_cores_times_hours_whatever_the_worker_count() -> None:
    colocated = engine_resources({"AGENTSERVE_ENGINE_NUM_THREADS": "2"}, {"colocated": 1})
    workers = engine_resources({"AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "1"}, {"prefill": 1, "decode": 1})
    assert colocated == workers == Resources(cores=2, gpus=0)
    four = engine_resources({"AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "2"}, {"prefill": 1, "decode": 1})
    shifted = engine_resources({"AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "1"}, {"prefill": 3, "decode": 1})
    assert four == shifted == engine_resources({"AGENTSERVE_ENGINE_NUM_THREADS": "4"}, {"colocated": 1})
    prices = CostSettings(price_per_core_hour=0.5, price_per_gpu_hour=3.0)
    one, two = (cost_figures(r, prices, 1800.0, 100, 200, 0) for r in (colocated, workers))
    assert one == two and one["cost_usd"] == pytest.approx(2 * 0.5 * 0.5)


def test_local_workers_share_the_one_gpu_they_name_and_ray_workers_hold_their_own() -> None:
    env = {"AGENTSERVE_ENGINE_DEVICE": "cuda", "AGENTSERVE_ENGINE_NUM_THREADS": "1"}
    assert engine_resources(env, {"colocated": 1}) == Resources(1, 1)
    local = env | {"AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "1"}
    assert engine_resources(local, {"prefill": 1, "decode": 2}) == Resources(3, 1)
    on_ray = local | {"AGENTSERVE_DEPLOYMENT_PLACEMENT": "ray", "AGENTSERVE_DEPLOYMENT_TRANSPORT": "tcp"}
    assert engine_resources(on_ray, {"prefill": 1, "decode": 2}) == Resources(3, 3)
    prices = CostSettings(price_per_core_hour=0.5, price_per_gpu_hour=3.0)
    assert cost_figures(Resources(3, 3), prices, 3600.0, 1000, 0, 0)["cost_usd"] == pytest.approx(3 * 0.5 + 3 * 3.0)


def test_cached_prompt_tokens_are_not_served_work() -> None:
    prices = CostSettings(price_per_core_hour=1.8, price_per_gpu_hour=0.0)
    figures = cost_figures(Resources(2), prices, 3600.0, output_tokens=1000, prompt_tokens=5000, cached_tokens=4000)
    assert figures["cost_usd"] == pytest.approx(3.6) and figures["computed_prompt_tokens"] == 1000
    assert figures["cost_per_1k_output_tokens"] == pytest.approx(3.6)
    assert figures["cost_per_1k_prompt_tokens"] == pytest.approx(3.6)
    assert figures["cost_per_1k_tokens"] == pytest.approx(1.8)
    uncached = cost_figures(Resources(2), prices, 3600.0, output_tokens=1000, prompt_tokens=5000, cached_tokens=0)
    assert uncached["cost_per_1k_prompt_tokens"] == pytest.approx(3.6 / 5)
    assert uncached["cost_per_1k_output_tokens"] == figures["cost_per_1k_output_tokens"]
    assert math.isnan(cost_figures(Resources(2), prices, 10.0, 0, 10, 10)["cost_per_1k_prompt_tokens"])


def test_prices_come_from_configs_cost_yaml_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    written = yaml.safe_load((CONFIGS_DIR / "cost.yaml").read_text())
    assert CostSettings().model_dump() == written
    monkeypatch.setenv("AGENTSERVE_COST_PRICE_PER_GPU_HOUR", "7.5")
    assert CostSettings().price_per_gpu_hour == 7.5


def test_probe_drain_is_the_slowest_reply_that_could_meet_the_slo() -> None:
    turns = tuple(Turn(0.0, 0.0, ({"role": "user", "content": "go"},), 1, tokens, "act", APPEND) for tokens in (5, 21))
    workload = Workload("w", (SessionScript("s", 0.0, "", turns),), {})
    limits = probe_limits(RunLimits(60.0, drain_timeout_s=60.0), Slo(0.5, 0.05), workload, 20.0)
    assert (limits.duration_s, limits.drain_timeout_s) == (20.0, pytest.approx(0.5 + 0.05 * 20 + 1.0))
    assert probe_limits(RunLimits(60.0, drain_timeout_s=2.0), Slo(0.5, 0.05), workload, 20.0).drain_timeout_s == 2.0


SLO = Slo(ttft_s=0.5, tpot_s=0.05)
SPLITS = {"baseline": {"colocated": 1}, "disaggregated": {"prefill": 1, "decode": 1},
          "agent": {"prefill": 1, "decode": 1}}
KNEES = {"baseline": 0.7, "disaggregated": 1.5, "agent": 3.7}


def stub_point(config: str, rate: float, tag: str) -> Point:
    """What a gateway of `config` would record at `rate`: 20 requests, each 10 tokens, late past the knee."""
    late = rate >= KNEES[config]
    ttft = [2.0 if late and i % 2 else 0.1 for i in range(20)]  # TPOT 0.04 s
    records = [RequestRecord(f"s{i}", 0, "act", i * 0.5, ttft[i], ttft[i] + 0.36, 100, 40 * (i % 2), 10)
               for i in range(20)]
    env = {"AGENTSERVE_ENGINE_NUM_THREADS": "2", "AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "1"}
    result = PointResult(config, records, [], dict.fromkeys(COUNTERS, 0.0),
                         {"split": SPLITS[config], "events": [], "source": "stub", "enabled": None}, [], env, "stub")
    return Point(config, tag, rate, result)


def stub_search(config: str, point_at: Callable[[str, float, str], Point] | None = None,
                ) -> tuple[list[Point], SearchResult[Point | None]]:
    """The SLO-rate search over stub points (`point_at(config, rate, tag)`, this file's `stub_point` by default)."""
    def measure(rate: float) -> tuple[float, Point | None]:
        point = (point_at or stub_point)(config, rate, f"probe{rate:g}")
        return slo_attainment(point.result.records, SLO), point

    search = search_slo_rate(measure, 0.2, SearchOptions(growth=2.0, max_probes=8))
    best = search.low.figures if search.low is not None else None
    points = [probe.figures for probe in search.probes if probe.figures is not None]
    return [replace(point, headline=point is best) for point in points], search


@pytest.fixture
def stub_report(tmp_path: Path) -> dict[str, Any]:
    settings = AgentBenchSettings(WorkloadOptions("swe"), slo=SLO, search=SearchSettings())
    points: list[Point] = []
    searches = {}
    for config in KNEES:
        config_points, searches[config] = stub_search(config)
        points += config_points
    report = assemble(settings, 0.2, Workload("swe", (), {}), points, searches, {"cpu_count": 2})
    write(tmp_path, report, points, ["a note"])
    return json.loads((tmp_path / "report.json").read_text()) | {"out": tmp_path}


def test_report_of_a_search_has_slo_rates_probes_and_ratios(stub_report: dict[str, Any]) -> None:
    configs, ratios = stub_report["configurations"], stub_report["ratios"]
    for config, knee in KNEES.items():
        figures = configs[config]
        assert figures["slo_rate_sessions_per_s"] < knee <= figures["slo_search"]["bracket"][1], config
        assert figures["slo_rate_rps"] == figures["throughput_rps"] > 0 and figures["slo_attainment"] >= 0.9
        assert figures["offered_rate"] == figures["slo_rate_sessions_per_s"]
        assert [p["rate"] for p in figures["slo_probes"]][:2] == pytest.approx([0.2, 0.4])
        assert all(0 <= p["attainment"] <= 1 for p in figures["slo_probes"]), config
    assert set(ratios) == {"agent/baseline", "disaggregated/baseline", "agent/disaggregated"}
    rate = {c: configs[c]["slo_rate_sessions_per_s"] for c in KNEES}
    assert ratios["agent/disaggregated"]["slo_rate"] == pytest.approx(rate["agent"] / rate["disaggregated"])
    assert ratios["agent/baseline"]["cost"] == pytest.approx(1.0)  # same cores, window and tokens at every rate
    checks = goal_check(config_ratios(configs))
    assert {c["measured_as"] for c in checks if c["figure"] == "throughput"} == {"slo_rate"}


def test_the_p99_goal_is_judged_at_the_baseline_slo_rate(tmp_path: Path) -> None:
    """With the agent measured at the baseline's SLO rate, its p99 there over the baseline's is the p99 goal's
    figure; without that point the goal falls back to the p99 at each one's own SLO rate."""
    settings = AgentBenchSettings(WorkloadOptions("swe"), slo=SLO, search=SearchSettings())
    points, searches = [], {}
    for config in ("baseline", "agent"):
        config_points, searches[config] = stub_search(config)
        points += config_points
    fallback = {c["figure"]: c["measured_as"] for c in assemble(settings, 0.2, Workload("swe", (), {}), points,
                                                                 searches, {"cpu_count": 2})["goal"]}
    assert fallback["p99_latency"] == "p99_latency"
    baseline_rate = searches["baseline"].rate
    extra = stub_point("agent", baseline_rate, "at-baseline-rate")
    report = assemble(settings, 0.2, Workload("swe", (), {}), [*points, extra], searches, {"cpu_count": 2})
    agent_row = next(r for r in report["sweep"]["agent"] if r["offered_rate"] == baseline_rate)
    expected = agent_row["p99_latency_s"] / report["configurations"]["baseline"]["p99_latency_s"]
    assert report["ratios"]["agent/baseline"]["p99_latency_at_baseline_rate"] == pytest.approx(expected)
    check = next(c for c in report["goal"] if c["figure"] == "p99_latency")
    assert check["measured_as"] == "p99_latency_at_baseline_rate" and check["measured"] == pytest.approx(expected)
    assert report["configurations"]["agent"]["offered_rate"] != baseline_rate  # the headline stays at its own SLO rate


def test_report_of_a_search_has_the_table_and_the_attainment_plot(stub_report: dict[str, Any]) -> None:
    markdown = (stub_report["out"] / "report.md").read_text()
    assert ("| configuration | throughput at SLO (sessions/s) | throughput at SLO (req/s) | P99 latency | "
            "cost ($/1k generated tokens) | cost ($/1k computed prompt tokens) |") in markdown
    assert "## SLO-rate search" in markdown and "agent/disaggregated" in markdown
    assert (stub_report["out"] / "attainment_vs_rate.png").read_bytes().startswith(b"\x89PNG")


def test_each_point_keeps_its_records_as_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search cut short after its first probe still has that probe's every request on disk."""
    stub = stub_point("agent", 1.0, "probe1")
    monkeypatch.setattr(run, "run_point", lambda config, workload, options, log, on_record: stub.result)
    with progress_display() as progress:
        point = run.measure_point("agent", "probe1", 1.0, Workload("swe", (), {}), RunOptions(), tmp_path, progress)
    lines = (tmp_path / "requests" / "agent-probe1.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [json.loads(json.dumps(asdict(r))) for r in point.result.records]
    assert len(lines) == 20


@pytest.mark.slow
def test_search_through_a_real_gateway_from_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frozen_while_driving: list[int] = []

    async def drive(*args: Any) -> Any:
        frozen_while_driving.append(gc.get_freeze_count())  # the client's own collections would pause its reads
        return await run_drive(*args)

    run_drive = run.drive
    monkeypatch.setattr(run, "drive", drive)
    main(["bench", "--workload", "swe", "--configs", "baseline", "--probe-duration", "6", "--search-start", "1",
          "--max-probes", "2", "--slo-ttft", "30", "--slo-tpot", "5", "--warm-up-turns", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    baseline = report["configurations"]["baseline"]
    assert report["settings"]["mode"] == "slo-rate search" and report["settings"]["search"]["max_probes"] == 2
    assert [p["rate"] for p in baseline["slo_probes"]] == [1.0, 4.0]  # an SLO nothing misses: it grows (x4)
    assert baseline["slo_rate_sessions_per_s"] == 4.0 and baseline["slo_search"]["capped"]
    assert baseline["slo_rate_rps"] == baseline["throughput_rps"] > 0 and baseline["requests_sent"] > 0
    assert "Throughput at SLO" in (tmp_path / "report.md").read_text()
    written = sorted(path.name for path in (tmp_path / "requests").glob("*.jsonl"))
    assert written == ["baseline-probe1.jsonl", "baseline-probe2.jsonl"]
    assert len(frozen_while_driving) == 4 and all(frozen_while_driving[1::2])  # warm-up, probe; each probe frozen
    assert gc.get_freeze_count() == 0


def test_the_bench_takes_its_configurations_probes_in_turn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`run_search` probes the configurations in turn, each finding the SLO rate its search finds alone."""
    order: list[str] = []

    def stub_prober(config: str, *args: object) -> Callable[[float], tuple[float, Point | None]]:
        def measure(rate: float) -> tuple[float, Point | None]:
            order.append(config)
            point = stub_point(config, rate, f"probe{rate:g}")
            return slo_attainment(point.result.records, SLO), point
        return measure

    monkeypatch.setattr(slo_module, "prober", stub_prober)
    settings = AgentBenchSettings(WorkloadOptions("swe"), configs=tuple(KNEES), slo=SLO,
                                  search=SearchSettings(options=SearchOptions(growth=2.0, max_probes=8)))
    with Progress(disable=True) as progress:
        points, searches = slo_module.run_search(settings, slo_module.probe_workloads(settings), 0.2, tmp_path,
                                                 progress)
    assert order[:9] == list(KNEES) * 3
    for config in KNEES:
        assert searches[config].rate == stub_search(config)[1].rate > 0
        assert [p.tag for p in points if p.config == config and p.headline] == [f"probe{searches[config].rate:g}"]
