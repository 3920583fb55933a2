"""`agentserve simulate --agent-table`: the agent benchmark's three configurations on calibrated workers, each what
the benchmark switches on, searched to their SLO rates and compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents_eval.sim.agent_table import AgentLoad, agent_clusters, agent_table, bench_load
from agents_eval.sim.calibration.fit import KINDS, Calibration
from agents_eval.sim.run import Summary
from agentserve.cli import main
from engine.core.slo import SloClass


def _calibration(tmp_path: Path, step_s: float = 0.002, per_seq_s: float = 0.0005) -> Path:
    path = tmp_path / "calibration.json"
    line = {"step": step_s, "seq": per_seq_s, "linear_flop": 0.0, "attention_flop": 0.0, "byte": 0.0}
    Calibration("tiny", "float32", dict.fromkeys(KINDS, line)).save(path)
    return path


def test_the_three_configurations_switch_on_what_the_benchmark_does(tmp_path: Path) -> None:
    baseline, disaggregated, agent = agent_clusters(_calibration(tmp_path), workers=4)
    assert [p.role for p in baseline.pools] == ["colocated"] and baseline.pools[0].workers == 4
    assert baseline.engine.prefix_caching and baseline.session_ttl_s is None and not baseline.controller
    assert [(p.role, p.workers) for p in disaggregated.pools] == [("prefill", 2), ("decode", 2)]
    assert disaggregated.engine.prefix_caching and not disaggregated.controller
    assert disaggregated.capacity["local_prefill_max_tokens"] == 0  # every prompt prefilled remotely
    assert agent.pools == disaggregated.pools and agent.controller and agent.session_ttl_s
    assert agent.capacity == {"min_per_role": 0}  # the router's own rules; a role may be left no worker
    assert {c.calibration for c in (baseline, disaggregated, agent)} == {str(tmp_path / "calibration.json")}
    assert baseline.slo == SloClass(ttft_s=0.5, tpot_s=0.05)  # the benchmark's


def test_one_worker_cannot_hold_both_roles(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        agent_clusters(_calibration(tmp_path), workers=1)


def test_the_load_is_the_benchmarks_sizes() -> None:
    swe, webarena = bench_load("swe", "tiny"), bench_load("webarena", "tiny")
    assert (swe.length_scale, webarena.length_scale) == (0.03, 0.25)
    assert swe.max_context == webarena.max_context == 2048  # tiny's context


def test_ratios_are_of_the_searched_slo_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    knees = {"baseline": 2.0, "disaggregated": 4.0, "agent": 8.0}

    def fake_run(self: AgentLoad, config: object, rate: float) -> Summary:
        met = 1.0 if rate <= knees[config.name] else 0.5  # type: ignore[attr-defined]
        return Summary(10, 1.0, 6 * rate, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, met, 100, 0.0, 0, 10)

    monkeypatch.setattr(AgentLoad, "run", fake_run)
    data = agent_table(agent_clusters(_calibration(tmp_path)), bench_load("swe", "tiny"), 1.0, steps=0)
    rates = {name: row["slo_rate_sessions_per_s"] for name, row in data["configurations"].items()}
    assert rates == knees
    assert data["ratios"] == {"agent/baseline": 4.0, "disaggregated/baseline": 2.0, "agent/disaggregated": 2.0}
    assert data["simulated"]


def test_the_command_searches_each_configuration_and_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    main(["simulate", "--agent-table", "--calibration", str(_calibration(tmp_path)), "--workload", "swe",
          "--duration", "8", "--warmup", "2", "--start-rate", "0.5", "--search-steps", "0", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert list(report["configurations"]) == ["baseline", "disaggregated", "agent"]
    for row in report["configurations"].values():
        assert row["points"] and all(p["requests"] > 0 for p in row["points"])
    assert set(report["ratios"]) == {"agent/baseline", "disaggregated/baseline", "agent/disaggregated"}
    text = (out / "report.md").read_text()
    assert "(simulated)" in text and "agent/disaggregated" in text and (out / "attainment.png").stat().st_size > 0


def test_the_table_needs_a_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--agent-table", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "--agent-table needs --calibration FILE" in capsys.readouterr().err
