"""The options of `agentserve bench faults` and the run: deploy, strike, audit, report."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from rich.progress import Progress

from agents_eval.bench.faults.campaign import CampaignSettings, campaign
from agents_eval.bench.faults.deployment import deployed
from agents_eval.bench.faults.report import goals, write

HELP = {
    "duration_s": "seconds during which sessions arrive (the faults strike at fixed shares of it)",
    "sessions_per_s": "session arrival rate (Poisson)",
    "turns": "turns of each agent session",
    "max_tokens": "output tokens of each turn",
    "turn_budget_s": "seconds a turn is retried before it counts as failed or lost",
    "drop_share": "share of streamed first attempts the client drops mid-stream",
    "seed": "seed of arrivals, protocols, replicas and drops",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = CampaignSettings()
    parser.add_argument("--out", type=Path, required=True, help="folder for the report files")
    parser.add_argument("--model", default="tiny", help="the replicas' model")
    parser.add_argument("--workers", type=int, default=2, help="prefill and decode workers each of replica 0")
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value, help=HELP[name])


def run(args: argparse.Namespace) -> None:
    settings = CampaignSettings(**{name: getattr(args, name) for name in vars(CampaignSettings())})
    began = time.monotonic()
    with deployed(args.model, args.workers, args.out) as deployment, Progress() as progress:
        result = asyncio.run(campaign(deployment, settings, progress))
    files = write(args.out, settings, result, time.monotonic() - began)
    print(files.markdown.read_text())
    missed = [c["figure"] for c in goals(result.figures()) if not c["met"]]
    print(f"report: {files.json}, chart: {files.chart}; goals missed: {', '.join(missed) or 'none'}")
