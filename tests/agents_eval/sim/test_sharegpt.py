"""The ShareGPT-like chatbot workload (DistServe's OPT-13B setting) and `agentserve simulate --distserve`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from agents_eval.sim.config import cluster_config
from agents_eval.sim.run import Window, simulate, summarize
from agents_eval.sim.workload import draw_sessions
from agents_eval.workloads.sharegpt import (
    MAX_TOTAL_TOKENS,
    OUTPUT_MEAN,
    OUTPUT_QUANTILES,
    PROMPT_MEAN,
    PROMPT_QUANTILES,
    QUANTILE_LEVELS,
)
from agentserve.cli import main
from engine.core.slo import SloClass


def test_lengths_follow_the_stated_statistics() -> None:
    sessions = draw_sessions("sharegpt", seed=3, rate=100.0, duration_s=200.0)  # about 20,000 requests
    assert len(sessions) > 15_000 and all(len(s.turns) == 1 and s.system_tokens == 0 for s in sessions)
    prompts = [s.turns[0].new_tokens for s in sessions]
    outputs = [s.turns[0].output_tokens for s in sessions]
    assert abs(statistics.mean(prompts) / PROMPT_MEAN - 1) < 0.03
    assert abs(statistics.mean(outputs) / OUTPUT_MEAN - 1) < 0.05  # the heavy tail cut at the context
    median = QUANTILE_LEVELS.index(0.5)
    assert abs(statistics.median(prompts) / PROMPT_QUANTILES[median] - 1) < 0.05
    assert abs(statistics.median(outputs) / OUTPUT_QUANTILES[median] - 1) < 0.1
    ninetieth = QUANTILE_LEVELS.index(0.9)
    assert abs(statistics.quantiles(prompts, n=10)[-1] / PROMPT_QUANTILES[ninetieth] - 1) < 0.05
    assert max(p + o for p, o in zip(prompts, outputs, strict=True)) <= MAX_TOTAL_TOKENS
    assert min(prompts) >= PROMPT_QUANTILES[0] and min(outputs) >= 1


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    first = draw_sessions("sharegpt", seed=1, rate=5.0, duration_s=20.0)
    assert first == draw_sessions("sharegpt", seed=1, rate=5.0, duration_s=20.0)
    assert first != draw_sessions("sharegpt", seed=2, rate=5.0, duration_s=20.0)


def test_a_cluster_slo_overrides_its_class() -> None:
    config = cluster_config("distserve13b-colocated")
    cluster, _ = simulate(config, draw_sessions("sharegpt", seed=0, rate=1.0, duration_s=10.0))
    price = cluster.price_per_hour()
    loose = config.model_copy(update={"slo": SloClass(ttft_s=100.0, tpot_s=100.0)})
    tight = config.model_copy(update={"slo": SloClass(ttft_s=1e-6, tpot_s=1e-6)})
    assert summarize(cluster.log, loose, price, Window()).attainment == 1.0
    assert summarize(cluster.log, tight, price, Window()).attainment == 0.0


def test_distserve_mode_reports_goodput_per_gpu_of_both(tmp_path: Path) -> None:
    main(["simulate", "--distserve", "--duration", "20", "--warmup", "4", "--search-steps", "0",
          "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    colocated, disaggregated = report["distserve"]
    assert (colocated["configuration"], colocated["gpus"]) == ("distserve13b-colocated", 1)
    assert (disaggregated["configuration"], disaggregated["gpus"]) == ("distserve13b-disaggregated", 3)
    for row in (colocated, disaggregated):
        assert row["points"] and row["goodput_per_gpu"] == row["goodput_rps"] / row["gpus"]
    assert colocated["goodput_per_gpu"] > 0 and disaggregated["goodput_per_gpu"] != colocated["goodput_per_gpu"]
    assert report["ratio_per_gpu"] == disaggregated["goodput_per_gpu"] / colocated["goodput_per_gpu"]
    assert (tmp_path / "attainment.png").stat().st_size > 0
    assert "distserve13b-disaggregated" in (tmp_path / "report.md").read_text()
