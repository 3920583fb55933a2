"""`agentserve simulate` writes its report: one short run of the seed's agent-optimized deployment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentserve.cli import main


def test_simulate_writes_report_and_plot(tmp_path: Path) -> None:
    main(["simulate", "--cluster", "moe27b-agent", "--rate", "0.2", "--duration", "10", "--warmup", "0",
          "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["summary"]
    assert summary["requests"] > 0 and 0 <= summary["attainment"] <= 1 and summary["ttft_p50_s"] > 0
    assert report["cluster"]["name"] == "moe27b-agent" and (tmp_path / "roles.png").stat().st_size > 0
    assert "moe27b-agent" in (tmp_path / "report.md").read_text()


def test_the_placement_search_places_the_named_cluster_with_its_controller(tmp_path: Path) -> None:
    main(["simulate", "--placement", "16", "--placement-cluster", "moe27b-agent", "--tensor-parallel", "8",
          "--duration", "20", "--warmup", "0", "--start-rate", "1", "--search-steps", "0", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["base"] == "moe27b-agent" and [r["placement"] for r in report["placement"]] == [
        "1 a800 tp8 + 1 h100 tp8"]
    assert "capacity controller on" in report["notes"][0]
    used = report["resources"]  # what the search cost, its 2 jobs' processes included
    assert used["jobs"] == 2 and used["cpu_s"] > 0 and used["wall_s"] > 0 and len(used["load_average_end"]) == 3
    assert "2 jobs at a time" in report["notes"][-1]


def test_an_unknown_placement_cluster_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--placement", "16", "--placement-cluster", "nope", "--out", str(tmp_path)])
    assert exited.value.code == 2 and "unknown cluster 'nope'" in capsys.readouterr().err
