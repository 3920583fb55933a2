"""`agentserve bench --workload coding-agent --model smollm2` (closed loop, `--loop closed`): the deployments a
user could pick (deployments.py), each on the same cores, driven by the same agent sessions.

1. The SLO: the calibration deployment (llama-server, else the first one) runs one agent for `light_calls`
   calls; the SLO is `slo_factor` x its TTFT and TPOT p50 (the model's speed on this host, now).
2. Each deployment in turn (agentserve's and the others interleaved, `--rotate` shifts the order): its light
   load (one agent, the same session), the most concurrent agents it holds within the SLO (90% of a step's
   requests; steps of `window_s`), and the completion time of a fixed batch of sessions started at once.
See docs/agents_eval.md ("coding-agent on smollm2").
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import Progress

from agents_eval.bench.agent.workload import build_workload
from agents_eval.bench.deployments.deployments import LLAMA_SERVER
from agents_eval.bench.deployments.figures import deployment_figures, derive_slo, goals, latency
from agents_eval.bench.deployments.measure import Measured, Plan, make_plan, measure_deployment
from agents_eval.bench.deployments.report import write
from agents_eval.bench.deployments.settings import ClosedLoopSettings
from agents_eval.harness.drive import progress_display
from agents_eval.harness.report import ReportFiles, finite, machine_info
from agents_eval.harness.stats import RequestRecord, Slo

POOL_SESSIONS = 120


def run_closed_loop(settings: ClosedLoopSettings, out_dir: Path) -> tuple[dict[str, Any], ReportFiles]:
    settings.validate()
    start = time.monotonic()
    machine = machine_info()
    workload = build_workload(settings.workload, settings.options.model, rate=POOL_SESSIONS / 100.0)
    plan = make_plan(workload.sessions, settings)
    reference = LLAMA_SERVER if LLAMA_SERVER in settings.deployments else settings.ordered()[0]
    with progress_display() as progress:
        calibration = _measure(reference, "calibration", settings, plan, None, out_dir, progress)
        slo = derive_slo(calibration.light.records, settings.slo_factor)
        share_s = (settings.budget_s - (time.monotonic() - start)) / len(settings.deployments)
        measured = [_measure(name, name, settings, plan, slo, out_dir, progress, share_s)
                    for name in settings.ordered()]
    configs = {m.name: deployment_figures(m, plan, slo, settings.options.max_agents) for m in measured}
    configs = {name: configs[name] for name in settings.deployments}
    report = {
        "workload": {"name": workload.name, "pool_sessions": len(plan.pool), "settings": workload.settings},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "factor": settings.slo_factor, "from": reference,
                "how": f"{settings.slo_factor:g} x {reference}'s single-agent TTFT p50 and TPOT p50, "
                       "measured at the start of the run", "single_agent": latency(calibration.light.records)},
        "configurations": configs, "goals": goals(configs), "order": list(settings.ordered()),
        "settings": _settings(settings), "machine": machine, "load_average_at_end": list(os.getloadavg()),
    }
    return report, write(out_dir, report)


def _measure(name: str, tag: str, settings: ClosedLoopSettings, plan: Plan, slo: Slo | None, out_dir: Path,
             progress: Progress, budget_s: float = math.inf) -> Measured:
    """One deployment; its requests, one JSON object a line, in `requests/<tag>.jsonl` as they finish."""
    task = progress.add_task(f"{tag}: {name}", total=None, note="errors 0")
    errors = 0
    (out_dir / "requests").mkdir(parents=True, exist_ok=True)
    with (out_dir / "requests" / f"{tag}.jsonl").open("w") as lines:

        def on_record(record: RequestRecord) -> None:
            nonlocal errors
            errors += not record.ok
            lines.write(json.dumps(finite(asdict(record))) + "\n")
            progress.update(task, advance=1, note=f"errors {errors}")

        measured = measure_deployment(name, settings, plan, slo, out_dir / "logs" / tag, on_record,
                                      budget_s)
    progress.stop_task(task)
    return measured


def _settings(settings: ClosedLoopSettings) -> dict[str, Any]:
    options = settings.options
    return {"mode": "closed loop", "workload": settings.workload.name, "seed": settings.workload.seed,
            "model": options.model, "threads": options.threads, "max_agents": options.max_agents,
            "kv_tokens": options.kv_tokens, "client": options.client, "litellm_strategy": options.litellm_strategy,
            "window_s": settings.window_s, "light_calls": settings.light_calls,
            "batch_sessions": settings.batch_sessions, "batch_calls": settings.batch_calls,
            "batch_timeout_s": settings.batch_timeout_s, "request_timeout_s": settings.request_timeout_s,
            "rotate": settings.rotate, "budget_s": settings.budget_s, "user_env": dict(options.env)}
