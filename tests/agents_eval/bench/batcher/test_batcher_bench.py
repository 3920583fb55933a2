"""The batcher benchmark end to end on a small workload: every request measured under both policies."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from agents_eval.bench.batcher import BatcherBenchSettings, run_benchmark
from agents_eval.bench.batcher.workload import AGENT, CHAT, VIP_AGENT, build_workload


def test_workload_is_seeded_and_fits_the_context() -> None:
    settings = BatcherBenchSettings(chat_requests=10, sessions=3, turns=2)
    first, again = build_workload(settings, 4096, 2048), build_workload(settings, 4096, 2048)
    assert first == again and first.num_requests == 10 + 3 * 2
    assert [s.kind for s in first.sessions] == [VIP_AGENT, AGENT, AGENT]
    assert all(c.arrival_step <= d.arrival_step for c, d in itertools.pairwise(first.chats))


def test_both_policies_serve_every_request(tmp_path: Path) -> None:
    settings = BatcherBenchSettings(chat_requests=12, sessions=2, turns=2, max_num_seqs=4)
    report = run_benchmark(settings, tmp_path)
    for policy in ("fcfs", "slo"):
        kinds = report["policies"][policy]["kinds"]
        assert (kinds[CHAT]["n"], kinds[AGENT]["n"], kinds[VIP_AGENT]["n"]) == (12, 2, 2)
        assert kinds["all"]["ttft_steps"]["p99"] >= 1 and kinds["all"]["tpot_steps"]["p50"] >= 1
    assert set(report["ratios"]) == {CHAT, AGENT, VIP_AGENT, "all"}
    assert json.loads((tmp_path / "report.json").read_text())["num_requests"] == 16
    assert "p99 under SLO / p99 under FCFS" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "ttft_p99.png").stat().st_size > 0
