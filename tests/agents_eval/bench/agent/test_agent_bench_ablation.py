"""`agentserve bench --workload W --configs ablation`: seven configurations, each adding one step to the one it
is measured against, from one engine without caching; the default baseline, colocated engines with prefix
caching; what each switches in the gateway; the ablation rows and table built from stub runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agents_eval.bench.agent.ablation import ablation_steps
from agents_eval.bench.agent.bench import AgentBenchSettings, assemble
from agents_eval.bench.agent.cli import settings_from_args
from agents_eval.bench.agent.configs import CONFIGS, DEFAULT_CONFIGS, BenchConfig, config_names
from agents_eval.bench.agent.report.notes import notes
from agents_eval.bench.agent.report.report import light_load_check, write
from agents_eval.bench.agent.run import Point, PointResult, gateway_env
from agents_eval.bench.agent.search.search import SearchResult
from agents_eval.bench.agent.settings import SearchSettings
from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.harness.servers.gateway import COUNTERS
from agents_eval.harness.stats import RequestRecord, Slo
from agents_eval.workloads.types import Workload
from agentserve.cli import EXIT_BAD_INPUT, build_parser, main
from tests.agents_eval.bench.agent.test_agent_bench_slo import stub_search as slo_stub_search

ABLATION = ("single", "caching", "sessions", "pruning", "disaggregated", "routing", "agent")
SWITCHES = ("disaggregated", "prefix_caching", "sessions", "pruning", "routing", "controller")
ADDED = {"caching": {"prefix_caching"}, "sessions": {"sessions"}, "pruning": {"pruning"},
         "disaggregated": {"disaggregated"}, "routing": {"sessions", "pruning", "routing"}, "agent": {"controller"}}
SLO = Slo(ttft_s=0.5, tpot_s=0.05)
MEASURED = ("baseline", *ABLATION)
KNEES = dict(zip(MEASURED, (0.9, 0.5, 0.7, 1.1, 1.3, 1.5, 2.9, 3.7), strict=True))


def switches(config: BenchConfig) -> dict[str, bool]:
    return {name: getattr(config, name) for name in SWITCHES}


def test_ablation_is_seven_configs_each_adding_its_switches_to_the_previous_one() -> None:
    assert config_names("ablation") == ABLATION and tuple(CONFIGS) == ("baseline", *ABLATION)
    assert config_names("default") == DEFAULT_CONFIGS == ("baseline", "disaggregated", "agent")
    assert config_names("baseline, agent,") == ("baseline", "agent")
    for name, added in ADDED.items():
        config = CONFIGS[name]
        assert config.previous is not None and config.adds, name
        now, before = switches(config), switches(CONFIGS[config.previous])
        assert {key for key in SWITCHES if now[key] != before[key]} == added, name
        assert all(now[key] for key in added), name  # steps only add
    assert all(switches(CONFIGS["agent"]).values()) and not any(switches(CONFIGS["single"]).values())


def test_each_configuration_sets_its_switches_in_the_gateway_environment() -> None:
    env = {name: gateway_env(name, {"AGENTSERVE_DEPLOYMENT_DECODE": "3"}) for name in ABLATION}
    for name in ABLATION:
        config = CONFIGS[name]
        assert env[name]["AGENTSERVE_ENGINE_ENABLE_PREFIX_CACHING"] == str(config.prefix_caching).lower(), name
        assert env[name]["AGENTSERVE_TRAJECTORY_PRUNE"] == env[name]["AGENTSERVE_TRAJECTORY_MASKS__ENABLED"] \
            == str(config.pruning).lower(), name
        assert env[name]["AGENTSERVE_DISAGGREGATED"] == str(config.disaggregated).lower(), name
        assert env[name]["AGENTSERVE_DEPLOYMENT_DECODE"] == "3"  # the user's overrides reach every gateway
        # equal cores: a colocated engine gets every worker's threads (1 prefill + 3 decode, 1 thread each)
        assert env[name].get("AGENTSERVE_ENGINE_NUM_THREADS") == (None if config.disaggregated else "4"), name
    assert env["disaggregated"]["AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_TOKENS"] == "0"
    assert env["disaggregated"]["AGENTSERVE_CAPACITY_OVERLAP_WEIGHT"] == "0"
    assert "AGENTSERVE_CAPACITY_LOCAL_PREFILL_MAX_TOKENS" not in env["routing"]
    assert env["routing"]["AGENTSERVE_CAPACITY_ENABLED"] == "false" and env["agent"]["AGENTSERVE_CAPACITY_ENABLED"] \
        == "true"
    # the controller may leave a role without a worker; a configuration without it keeps the configured floor
    assert env["agent"]["AGENTSERVE_CAPACITY_MIN_PER_ROLE"] == "0" and "AGENTSERVE_CAPACITY_MIN_PER_ROLE" not in \
        env["routing"]


def test_the_default_baseline_is_the_agent_workers_each_a_colocated_engine_with_prefix_caching() -> None:
    """As many colocated engine processes as the agent configuration's workers, with their threads, each with
    prefix caching on: no prefill worker, no controller, the stateless client; what the report says of it."""
    baseline = CONFIGS["baseline"]
    assert switches(baseline) == {**dict.fromkeys(SWITCHES, False), "prefix_caching": True}
    assert baseline.replicas and baseline.previous is None
    env = gateway_env("baseline", {"AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "2"})
    assert env["AGENTSERVE_DISAGGREGATED"] == "true" and env["AGENTSERVE_CAPACITY_ENABLED"] == "false"
    assert env["AGENTSERVE_ENGINE_ENABLE_PREFIX_CACHING"] == "true" and "AGENTSERVE_ENGINE_NUM_THREADS" not in env
    # the user's split would override this one; without it, 1 + 1 workers become 0 + 2
    assert gateway_env("baseline", {})["AGENTSERVE_DEPLOYMENT_PREFILL"] == "0"
    assert gateway_env("baseline", {})["AGENTSERVE_DEPLOYMENT_DECODE"] == "2"
    assert gateway_env("baseline", {"AGENTSERVE_DEPLOYMENT_DECODE": "3"})["AGENTSERVE_DEPLOYMENT_DECODE"] == "3"
    assert baseline.deployment(2, 2) == {"kind": "colocated", "processes": 2, "threads_per_process": 2, "threads": 4,
                                         "prefix_caching": True, "sessions": False}
    assert CONFIGS["single"].deployment(2, 2) == {"kind": "colocated", "processes": 1, "threads_per_process": 4,
                                                  "threads": 4, "prefix_caching": False, "sessions": False}
    assert CONFIGS["agent"].deployment(2, 2)["processes"] == 2 and "baseline" not in config_names("ablation")


def test_configs_option_takes_the_named_set_and_rejects_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--workload", "swe", "--configs", "ablation", "--out", "x"]
    args = build_parser(argv).parse_args(argv)
    assert settings_from_args(args).configs == ABLATION
    default = build_parser(argv[:3] + argv[5:]).parse_args(argv[:3] + argv[5:])
    assert settings_from_args(default).configs == DEFAULT_CONFIGS
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--workload", "swe", "--configs", "baseline,turbo", "--out", "x"])
    assert exit_info.value.code == EXIT_BAD_INPUT and "ablation" in capsys.readouterr().err


def test_history_policy_option_sets_every_gateway_s_default_policy() -> None:
    argv = ["bench", "--workload", "swe", "--history-policy", "attention", "--out", "x"]
    run = settings_from_args(build_parser(argv).parse_args(argv)).run
    assert gateway_env("agent", run.env)["AGENTSERVE_TRAJECTORY_HISTORY__DEFAULT"] == "attention"
    assert gateway_env("baseline", run.env)["AGENTSERVE_TRAJECTORY_HISTORY__DEFAULT"] == "attention"
    plain = ["bench", "--workload", "swe", "--out", "x"]
    default = settings_from_args(build_parser(plain).parse_args(plain)).run.env
    assert "AGENTSERVE_TRAJECTORY_HISTORY__DEFAULT" not in default


def stub_point(config: str, rate: float, tag: str) -> Point:
    """20 requests of 10 tokens, half of them late past the configuration's knee; pruning steps prune."""
    late = rate >= KNEES[config]
    ttft = [2.0 if late and i % 2 else 0.1 * (1 + MEASURED.index(config) % 3) for i in range(20)]
    records = [RequestRecord(f"s{i}", 0, "act", i * 0.5, ttft[i], ttft[i] + 0.36, 100, 0, 10) for i in range(20)]
    deltas = dict.fromkeys(COUNTERS, 0.0)
    if CONFIGS[config].pruning:
        deltas |= {"pruned_tokens": 30.0, "masked_tokens": 0.0 if config == "routing" else 400.0}
    disaggregated = CONFIGS[config].disaggregated
    split = {"prefill": 1, "decode": 1} if disaggregated else {"colocated": 1}
    env = {"AGENTSERVE_ENGINE_NUM_THREADS": "2", "AGENTSERVE_DEPLOYMENT_THREADS_PER_WORKER": "1"}
    result = PointResult(config, records, [], deltas, {"split": split, "events": [], "source": "stub",
                                                       "enabled": None}, [], env, "stub")
    return Point(config, tag, rate, result)


def stub_search(config: str) -> tuple[list[Point], SearchResult[Point | None]]:
    return slo_stub_search(config, stub_point)


@pytest.fixture(scope="module")
def ablation_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    settings = AgentBenchSettings(WorkloadOptions("swe"), configs=MEASURED, slo=SLO, search=SearchSettings())
    points: list[Point] = []
    searches = {}
    for config in MEASURED:
        config_points, searches[config] = stub_search(config)
        points += config_points
    report = assemble(settings, 0.2, Workload("swe", (), {}), points, searches,
                      {"cpu_count": 2, "load_average": [0.0, 0.0, 0.0]})
    out = tmp_path_factory.mktemp("ablation")
    write(out, report, points, notes(settings, report))
    return json.loads((out / "report.json").read_text()) | {"out": out}


def test_each_step_is_measured_against_its_previous_one(ablation_report: dict[str, Any]) -> None:
    configs, steps = ablation_report["configurations"], ablation_report["ablation"]
    assert [(s["config"], s["previous"]) for s in steps] == [(name, CONFIGS[name].previous) for name in ADDED]
    for step in steps:
        now, before = configs[step["config"]], configs[step["previous"]]
        assert step["throughput_measured_as"] == "slo_rate_sessions_per_s"
        assert step["throughput"] == now["slo_rate_sessions_per_s"] < KNEES[step["config"]]
        assert step["change"]["throughput"] == pytest.approx(now["slo_rate_sessions_per_s"]
                                                             - before["slo_rate_sessions_per_s"])
        assert step["ratio"]["p99_ttft_s"] == pytest.approx(now["latency"]["ttft"]["p99"]
                                                            / before["latency"]["ttft"]["p99"])
        assert step["ratio"]["cost_per_1k_output_tokens"] == pytest.approx(
            now["cost_per_1k_output_tokens"] / before["cost_per_1k_output_tokens"])
        assert step["pruned_tokens"] == now["pruned_tokens"]


def test_the_report_has_the_ablation_table_and_flags_idle_pruning(ablation_report: dict[str, Any]) -> None:
    markdown = (ablation_report["out"] / "report.md").read_text()
    assert "## Ablation: what each step buys" in markdown
    assert "| + prefix caching | one engine, no prefix caching | prefix caching" in markdown
    assert "| agent-optimized | + KV-aware routing, conditional disaggregation | the capacity controller |" in markdown
    assert "routing: 0 tokens masked, with pruning and masks on" in markdown
    assert "pruning: 0 tokens" not in markdown


def test_the_default_three_have_no_ablation_rows(ablation_report: dict[str, Any]) -> None:
    configs = ablation_report["configurations"]
    assert ablation_steps({name: configs[name] for name in DEFAULT_CONFIGS}) == []
    assert [s["config"] for s in ablation_steps({name: configs[name] for name in ("caching", "disaggregated")})] \
        == ["disaggregated"]


def test_light_load_compares_agent_and_baseline_at_the_lowest_rate_both_ran() -> None:
    sweep = {"agent": [{"offered_rate": 0.2, "p50_latency_s": 1.0, "p99_latency_s": 3.0},
                       {"offered_rate": 0.4, "p50_latency_s": 9.0, "p99_latency_s": 9.0}],
             "baseline": [{"offered_rate": 0.1, "p50_latency_s": 0.1, "p99_latency_s": 0.1},
                          {"offered_rate": 0.2, "p50_latency_s": 1.0, "p99_latency_s": 2.0}]}
    p50, p99 = light_load_check(sweep)
    assert (p50["rate"], p50["measured"], p50["met"]) == (0.2, 1.0, True)
    assert (p99["measured"], p99["met"], p99["shortfall"]) == (1.5, False, pytest.approx(1.5 / 1.1))
    assert light_load_check({"agent": sweep["agent"]}) == []


def test_the_goal_section_has_the_light_load_check(ablation_report: dict[str, Any]) -> None:
    [p50, p99] = ablation_report["light_load"]
    assert p50["rate"] == p99["rate"] == 0.2 and p50["target"] == 1.1
    markdown = (ablation_report["out"] / "report.md").read_text()
    assert "- agent p99 latency at 0.2 sessions/s is " in markdown
