"""Record agent sessions for the predictor: a workload's sessions driven through the agent-optimized gateway
(the deployment whose capacity controller reads the forecast) with `record_sessions` on.

    .venv/bin/python scripts/record_agent_sessions.py --workload webarena --out predictor/recordings/webarena.jsonl

Sessions start as the workload plans them for `--arrivals` seconds at `--rate` sessions/s; every session then
runs to its end (within `--tail` more seconds), so the recording holds whole sessions. The gateway writes one
line per finished turn (docs/predictor.md); an existing file is replaced unless `--append` (session ids
carry the seed, so runs with different seeds add distinct sessions). The gateway's log goes to the
temporary folder (`record-<workload>-gateway.log`). Each chat request carries the
session id (`X-Session-Id`), so the gateway keeps each session and counts its cached tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import httpx

from agents_eval.bench.agent.run import HTTP, gateway_env, session_opener
from agents_eval.bench.agent.workload import WorkloadOptions, build_workload
from agents_eval.harness.client import HttpPool
from agents_eval.harness.drive import DriveResult, RunLimits, WorkloadLike, drive
from agents_eval.harness.servers.gateway import model_name, running_gateway

RECORDED_CONFIG = "agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("webarena", "swe"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="the recording (JSONL) to write")
    parser.add_argument("--rate", type=float, default=0.5, help="sessions starting per second")
    parser.add_argument("--arrivals", type=float, default=150.0, help="seconds during which sessions start")
    parser.add_argument("--tail", type=float, default=60.0, help="seconds after that for sessions to finish")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--append", action="store_true", help="add to the file (another seed) instead of replacing it")
    args = parser.parse_args(argv)
    if min(args.rate, args.arrivals) <= 0 or args.tail < 0:
        parser.error("--rate and --arrivals must be positive, --tail at least 0")
    return args


async def _drive(url: str, workload: WorkloadLike, limits: RunLimits) -> DriveResult:
    pool = HttpPool(url, limits.request_timeout_s)
    try:
        async with httpx.AsyncClient(base_url=url) as admin:
            opener = session_opener(RECORDED_CONFIG, HTTP, await model_name(admin), pool, None)
        return await drive(workload, opener, limits, lambda record: None)
    finally:
        await pool.close()


def record(args: argparse.Namespace) -> DriveResult:
    workload = build_workload(WorkloadOptions(args.workload, args.seed, args.rate, args.arrivals), args.model,
                              args.rate)
    out = args.out.resolve()
    if not args.append:
        out.unlink(missing_ok=True)
    env = gateway_env(RECORDED_CONFIG, {"AGENTSERVE_RECORD_SESSIONS": str(out)})
    limits = RunLimits(duration_s=args.arrivals + args.tail)
    log = Path(tempfile.gettempdir()) / f"record-{args.workload}-gateway.log"
    with running_gateway(args.model, env, log) as gateway:
        return asyncio.run(_drive(gateway.url, workload, limits))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = record(args)
    errors = [item.error for item in result.records if item.error] + result.session_errors
    sessions = len({item.session_id for item in result.records})
    print(f"{args.out}: {len(result.records)} turns of {sessions} {args.workload} sessions, {len(errors)} errors")
    if errors:
        print("first error:", errors[0], file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
