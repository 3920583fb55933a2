"""The options of `agentserve bench overload` and its report: the SLO rate, then per run (guarded by
admission control, unguarded) what the requests came to and whether the goals hold, with a chart."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from agents_eval.bench.agent.configs import CONFIGS
from agents_eval.bench.agent.workload import WORKLOADS
from agents_eval.bench.overload.overload import OverloadSettings, run_overload
from agents_eval.harness.drive import progress_display
from agents_eval.harness.report import BarChart, ReportFiles, Table, write_report
from agents_eval.harness.servers.gateway import env_item
from agents_eval.harness.stats import Slo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = OverloadSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--workload", choices=WORKLOADS, default=d.workload)
    parser.add_argument("--config", choices=tuple(CONFIGS), default=d.config, help="the configuration overloaded")
    parser.add_argument("--model", default=d.model, help="built-in model name or checkpoint dir")
    parser.add_argument("--factor", type=float, default=d.factor, help="offered rate, times the SLO rate")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="seconds of each overloaded run")
    parser.add_argument("--slo-ttft", type=float, default=d.slo.ttft_s, help="TTFT SLO, seconds")
    parser.add_argument("--slo-tpot", type=float, default=d.slo.tpot_s, help="TPOT SLO, seconds")
    parser.add_argument("--slo-rate", type=float, help="sessions/s known to meet the SLO: skips the search")
    parser.add_argument("--probe-duration", type=float, default=d.probe_duration_s, help="seconds of each probe")
    parser.add_argument("--max-probes", type=int, default=d.max_probes, help="probes of the search at most")
    parser.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    parser.add_argument("--retries", type=int, default=d.retries, help="sends of a refused turn again, after its "
                        "Retry-After")
    parser.add_argument("--max-retry-wait", type=float, default=d.max_retry_wait_s,
                        help="seconds a client waits for a Retry-After at most")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--env", type=env_item, action="append", default=[], metavar="AGENTSERVE_KEY=VALUE",
                        help="setting for every gateway (repeatable)")


def settings_from_args(args: argparse.Namespace) -> OverloadSettings:
    return OverloadSettings(args.workload, args.config, args.model, args.factor, args.duration,
                            Slo(args.slo_ttft, args.slo_tpot), args.slo_rate, args.probe_duration, args.max_probes,
                            args.request_timeout, args.retries, args.max_retry_wait, args.seed, dict(args.env))


def _show(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3g}"


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def write(out: Path, report: dict[str, Any]) -> ReportFiles:
    slo = report["settings"]["slo"]
    runs = report["runs"]
    headers = ["run", "sent", "completed", "refused (status: n)", "refused for", "no Retry-After", "timed out",
               "other errors", "TTFT p99 (ms)", "TPOT p99 (ms)", "completed within SLO", "turns within SLO",
               "with retry waits", "retried turns"]
    rows = [[tag, str(r["sent"]), str(r["completed"]), ", ".join(f"{s}: {n}" for s, n in r["refused"].items()) or "0",
             ", ".join(f"{cause}: {n}" for cause, n in r.get("refused_for", {}).items()) or "-",
             str(r["refused_without_retry_after"]), str(r["timed_out"]), str(r["other_errors"]),
             _ms(r["admitted_ttft_p99_s"]), _ms(r["admitted_tpot_p99_s"]), f"{r['admitted_within_slo']:.0%}",
             str(r["turns_within_slo"]), str(r["turns_within_slo_with_waits"]), str(r["retried_turns"])]
            for tag, r in runs.items()]
    goals = [[g["name"], f"{g['bound']} {g['target']:g}", _show(g["measured"]), "met" if g["met"] else "MISSED"]
             for g in report["goals"]]
    chart = BarChart("overload.png", f"TTFT p99 at {report['settings']['factor']:g}x the SLO rate "
                     f"(SLO {slo['ttft_s'] * 1000:.0f} ms)", "ms", list(runs),
                     [0.0 if math.isnan(r["admitted_ttft_p99_s"]) else r["admitted_ttft_p99_s"] * 1000
                      for r in runs.values()])
    bound = " (a lower bound: every probe met the SLO)" if report["slo_rate_is_lower_bound"] else ""
    notes = [f"SLO rate {report['slo_rate_sessions_per_s']:.3g} sessions/s{bound}; offered "
             f"{report['offered_rate_sessions_per_s']:.3g} sessions/s for {report['settings']['duration_s']:g} s; "
             f"SLO TTFT {slo['ttft_s'] * 1000:.0f} ms, TPOT {slo['tpot_s'] * 1000:.0f} ms.",
             "guarded: admission control at the TTFT and TPOT SLO; unguarded: every request admitted. A refused "
             f"turn is sent again after its Retry-After (at most {report['settings']['retries']} times, "
             f"{report['settings']['max_retry_wait_s']:g} s each); turns within SLO count the attempt that completed, "
             "'with retry waits' adds the time the turn waited to its TTFT."]
    return write_report(out, report, "Overload", [Table("Requests at overload", headers, rows),
                                                  Table("Goals", ["goal", "target", "measured", "verdict"], goals)],
                        chart, notes)


def run(args: argparse.Namespace) -> None:
    with progress_display() as progress:
        report = run_overload(settings_from_args(args), args.out, progress)
    files = write(args.out, report)
    print(files.markdown.read_text())
    print(f"report: {files.json}, chart: {files.chart}")
