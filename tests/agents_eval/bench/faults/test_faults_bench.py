"""A short fault campaign (`agentserve bench faults`) on real processes: two gateway replicas sharing a real
Redis, a decode and a prefill worker SIGKILLed, Redis killed and restarted, a replica SIGTERMed and streams
dropped by their clients; every fault strikes, turns are retried through them, and nothing is lost,
duplicated or corrupted, nor any KV block leaked."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from rich.progress import Progress

from agents_eval.bench.faults.campaign import SCHEDULE, CampaignSettings, campaign
from agents_eval.bench.faults.deployment import deployed
from agents_eval.bench.faults.report import write
from agentserve.cli import main

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")]


def test_a_short_campaign_loses_duplicates_corrupts_and_leaks_nothing(tmp_path: Path) -> None:
    settings = CampaignSettings(duration_s=24.0, sessions_per_s=0.6, turns=3, drop_share=0.3, seed=1)
    with deployed("tiny", 2, tmp_path) as deployment, Progress(disable=True) as progress:
        result = asyncio.run(campaign(deployment, settings, progress))
    figures = result.figures()
    assert [what.split(" (")[0] for _, what in result.timeline][2:] == [w for _, w in SCHEDULE][2:]
    assert all(what.startswith("killed") for _, what in result.timeline[:2])
    assert figures["turns"] >= 6 and figures["completed"] >= 6
    assert figures["retried"] > 0  # the faults (and the dropped streams) were felt
    assert (figures["lost"], figures["duplicated"], figures["sessions_corrupted"]) == (0, 0, 0), figures
    assert figures["kv_blocks_leaked"] == 0, (result.kv_blocks_idle, result.kv_blocks_after)
    assert figures["completed"] + figures["failed_clean"] == figures["turns"]
    files = write(tmp_path / "report", settings, result, 1.0)
    report = json.loads(files.json.read_text())
    assert all(goal["met"] for goal in report["goals"]) and files.chart.stat().st_size > 0


def test_the_command_refuses_a_bad_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "faults", "--out", "x", "--duration-s", "soon"])
    assert "invalid float value" in capsys.readouterr().err
