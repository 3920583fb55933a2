"""`agentserve simulate` writes its report: one short run of the seed's agent-optimized deployment."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main


def test_simulate_writes_report_and_plot(tmp_path: Path) -> None:
    main(["simulate", "--cluster", "seed-agent", "--rate", "0.2", "--duration", "10", "--warmup", "0",
          "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["summary"]
    assert summary["requests"] > 0 and 0 <= summary["attainment"] <= 1 and summary["ttft_p50_s"] > 0
    assert report["cluster"]["name"] == "seed-agent" and (tmp_path / "roles.png").stat().st_size > 0
    assert "seed-agent" in (tmp_path / "report.md").read_text()
