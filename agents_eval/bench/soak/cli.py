"""The options of `agentserve bench soak`, the gateway it runs (its own process, sessions expiring after
`--session-ttl-s`), and its report: the samples, the slopes after the warm-up, and a chart of them."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from rich.progress import Progress

from agents_eval.bench.soak.soak import SoakResult, SoakSettings, goals, soak
from agents_eval.harness.report import LineChart, ReportFiles, Table, write_report
from agents_eval.harness.servers.gateway import running_gateway

HELP = {
    "duration_s": "seconds of load", "sessions_per_s": "session arrival rate (Poisson)",
    "turns": "turns of each agent session", "max_tokens": "output tokens of each turn",
    "sample_s": "seconds between samples of memory, descriptors and latency",
    "session_ttl_s": "the gateway's session TTL: sessions keep expiring during the soak",
    "seed": "seed of arrivals and protocols",
    "max_in_flight": "sessions running at once; an arrival beyond it is skipped and counted (0: no bound)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SoakSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default="tiny", help="the gateway's model")
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=HELP[name])


def run_soak(model: str, settings: SoakSettings, out: Path, quiet: bool = False) -> SoakResult:
    env = {"AGENTSERVE_SESSION_TTL_S": str(settings.session_ttl_s)}
    with running_gateway(model, env, out / "gateway.log") as gateway, Progress(disable=quiet) as progress:
        return asyncio.run(soak(gateway.url, gateway.process.pid, settings, progress))


def write(out: Path, settings: SoakSettings, result: SoakResult, wall_s: float) -> ReportFiles:
    slopes, found = result.slopes_per_hour(), goals(result)
    data = {"settings": vars(settings), "turns": result.turns, "completed": result.completed,
            "skipped_arrivals": result.skipped_arrivals, "slopes_per_hour": slopes, "window_h": result.window_h(),
            "goals": found, "goals_met": all(g["met"] for g in found), "samples": [vars(s) for s in result.samples],
            "wall_s": round(wall_s, 1)}
    table = Table("Slopes after the warm-up (least squares)", ["figure", "per hour"],
                  [[name, "n/a" if value is None else f"{value:+.2f}"] for name, value in slopes.items()])
    rows = [[f"{s.at_s:.0f}", f"{s.rss_mb:.0f}", str(s.fds), str(s.sessions),
             "" if s.turn_p50_ms is None else f"{s.turn_p50_ms:.0f}"] for s in result.samples]
    samples = Table("Samples", ["at (s)", "RSS (MB)", "open fds", "sessions held", "turn p50 (ms)"], rows)
    chart = LineChart("soak.png", "Soak: memory, descriptors, sessions", "seconds from start", "value",
                      [s.at_s for s in result.samples],
                      {"RSS (MB)": [s.rss_mb for s in result.samples], "open fds": [s.fds for s in result.samples],
                       "sessions held": [s.sessions for s in result.samples]})
    notes = [f"{result.completed} of {result.turns} turns completed over {settings.duration_s:.0f} s; "
             f"sessions expire after {settings.session_ttl_s:.0f} s; {result.skipped_arrivals} arrivals skipped "
             f"(max in flight {settings.max_in_flight or 'unbounded'}).",
             *(f"Goal {g['name']}: {'n/a' if g['measured'] is None else format(g['measured'], '.2f')} "
               f"({g['bound']} {g['target']:g}): {'met' if g['met'] else 'missed'}" for g in found)]
    return write_report(out, data, "Soak", [table, samples], chart, notes)


def run(args: argparse.Namespace) -> None:
    settings = SoakSettings(**{name: getattr(args, name) for name in vars(SoakSettings())})
    began = time.monotonic()
    result = run_soak(args.model, settings, args.out)
    files = write(args.out, settings, result, time.monotonic() - began)
    print(files.markdown.read_text())
    print(f"report: {files.json}, chart: {files.chart}")
