"""The closed loop end to end, through real processes on loopback (quick sizes): agentserve's gateway on the
`tiny` model; and, where llama.cpp's server is installed, llama-server alone, agentserve's gateway and LiteLLM's
proxy over two llama-servers, on SmolLM2's GGUF file. Figures are whatever the host gives; the tests check
what was run and what the report holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agents_eval.bench.agent.workload import WorkloadOptions
from agents_eval.bench.deployments.bench import run_closed_loop
from agents_eval.bench.deployments.deployments import DeploymentOptions
from agents_eval.bench.deployments.settings import ClosedLoopSettings, quick
from agents_eval.bench.peer.settings import llama_server_binary

FRONTS = ("llama-server", "agentserve-upstreams", "litellm-upstreams")


def settings(model: str, deployments: tuple[str, ...]) -> ClosedLoopSettings:
    options = DeploymentOptions(model, threads=2, max_agents=2, kv_tokens=16384, request_timeout_s=120.0)
    return quick(ClosedLoopSettings(WorkloadOptions("coding-agent"), deployments, options,
                                    request_timeout_s=120.0, budget_s=600.0))


def check_report(report: dict, out: Path, deployments: tuple[str, ...]) -> None:
    assert list(report["configurations"]) == list(deployments)
    written = json.loads((out / "report.json").read_text())["goals"]
    assert [(g["name"], g["met"]) for g in written] == [(g["name"], g["met"]) for g in report["goals"]]
    assert (out / "report.md").is_file() and (out / "agents.png").read_bytes()[:4] == b"\x89PNG"
    assert [g["bound"] for g in report["goals"]] == ["min", "max", "max"]
    assert report["slo"]["ttft_s"] > 0 and report["slo"]["tpot_s"] > 0
    for figures in report["configurations"].values():
        assert figures["light_load"]["requests"] >= 2 and figures["light_load"]["errors"] == 0
        assert figures["steps"][0]["agents"] == 1 and figures["steps"][0]["requests"] >= 1
        assert figures["batch"]["sessions"] == 2
        assert isinstance(figures["agents_held_is_lower_bound"], bool)


@pytest.mark.slow
def test_agentserve_gateway_on_tiny(tmp_path: Path) -> None:
    report, _ = run_closed_loop(settings("tiny", ("baseline",)), tmp_path)
    check_report(report, tmp_path, ("baseline",))
    assert report["slo"]["from"] == "baseline"  # no llama-server: the first deployment calibrates
    assert report["configurations"]["baseline"]["deployment"]["server"] == "agentserve"
    assert math.isnan(report["goals"][0]["measured"]) and not report["goals"][0]["met"]  # nothing to compare


@pytest.mark.slow
@pytest.mark.skipif(llama_server_binary() is None, reason="llama.cpp's server: bash scripts/setup.sh --peer")
def test_llama_server_and_the_two_fronts_over_two_llama_servers(tmp_path: Path) -> None:
    report, _ = run_closed_loop(settings("smollm2", FRONTS), tmp_path)
    check_report(report, tmp_path, FRONTS)
    configs = report["configurations"]
    assert report["slo"]["from"] == "llama-server"
    assert configs["llama-server"]["deployment"]["threads"] == 2
    for front, routing in (("agentserve-upstreams", "affinity"), ("litellm-upstreams", "simple-shuffle")):
        assert configs[front]["deployment"]["routing"] == routing
        assert [u["threads"] for u in configs[front]["deployment"]["upstreams"]] == [1, 1]
    # session affinity: the one agent's turns stay on one llama-server, whose prompt cache holds its history
    assert configs["agentserve-upstreams"]["light_load"]["cached_share"] > 0.5
    assert all(g["measured"] is not None for g in report["goals"])
