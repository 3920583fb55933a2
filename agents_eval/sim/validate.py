"""`agentserve simulate --validate`: the simulator, calibrated by `agentserve profile`, against real CPU runs it
was not fitted on: the swe workload at two rates, colocated (one `LLMEngine`) and disaggregated (one prefill
and one decode worker process), TTFT and TPOT p50 and p90, predicted beside measured.

Each real run is taken `repeats` times, the four runs in turn (every run once, then every run again), and a
figure is measured on the requests of all its repeats pooled: this host's speed moves by 10-15% from one minute
to the next, so one run of each put a slow minute on one figure whole. (A host-speed probe timed around each run,
scaling the prediction, was tried in runs 13-15 and removed: it did not track the runs, docs/simulator.md.)

The report also predicts every figure again at the speed the runs' own traced steps ran at (`at_run_speed`), a
diagnosis that splits the error into the host's drift since the profile and the simulator's own; the validation's
figure, `max_relative_error`, is the prediction from the profile alone."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from agents_eval.report import Table
from agents_eval.sim.calibration import Calibration
from agents_eval.sim.config import ClusterConfig, EngineKnobs, Pool
from agents_eval.sim.real_runs import in_process, play, through_processes
from agents_eval.sim.run import simulate
from agents_eval.sim.specs import DEVICES_DIR
from agents_eval.sim.step_agreement import agreement, run_speed
from agents_eval.sim.workload import SimSession, from_workload
from agents_eval.workloads import swe
from engine.core.step_trace import TracedStep, read_steps

RATES = (0.1, 0.3)  # swe sessions per second
# 120 s of arrivals, at most 300 requests: at 60 s and 150, the 0.1 sessions/s run held 77 requests of 6 sessions, and
# its TTFT is bimodal (the smallest deltas against the rest), so 2-3 ms moved its median from one mode to the other
DURATION_S = 120.0
MAX_REQUESTS = 300
TTL_S = 30.0
DEPLOYMENTS = ("colocated", "1 prefill + 1 decode")
REPEATS = 2  # real runs of each deployment and rate, in turn
WARM_UP_PROMPT_TOKENS = (256, 1024, 2048)  # each request of the warm-up, run together
WARM_UP_OUTPUT_TOKENS = 8


def engine_knobs(model: str) -> EngineKnobs:
    """The real engine's scheduler settings (the defaults), and the KV blocks it gives `model`."""
    from engine.config import EngineSettings
    from engine.core.validation import num_kv_blocks
    from engine.model.loader import resolve_model

    settings = EngineSettings()
    return EngineKnobs(block_size=settings.block_size, max_num_batched_tokens=settings.max_num_batched_tokens,
                       max_num_seqs=settings.max_num_seqs, queue_policy=settings.queue_policy,
                       max_kv_blocks=num_kv_blocks(resolve_model(model).config, settings))


def measured_cluster(deployment: str, calibration: Path | None, model: str) -> ClusterConfig:
    """The deployment the real runs used, on the device and dtype the engine's settings give them. Without a
    calibration it runs on the roofline of the device's datasheet (`configs/devices/`)."""
    from engine.config import EngineSettings

    settings = EngineSettings()
    roles = ("colocated",) if deployment == DEPLOYMENTS[0] else ("prefill", "decode")
    pools = tuple(Pool(device=device_spec(settings.device), nodes=1, gpus_per_node=1, tensor_parallel=1, role=role)  # type: ignore[arg-type]
                  for role in roles)
    return ClusterConfig(name=deployment, model=model, dtype=settings.dtype, pools=pools, engine=engine_knobs(model),
                         transport="shm", calibration=None if calibration is None else str(calibration),
                         session_ttl_s=TTL_S, controller=len(roles) > 1,
                         worker_processes=len(roles) > 1)  # colocated: LLMEngine in process


def device_spec(device: str) -> str:
    """The `configs/devices/` spec of the engine's device: `cpu`, or the GPU whose spec name its name contains."""
    if device == "cpu":
        return "cpu"
    import torch

    words = torch.cuda.get_device_name(torch.device(device)).lower().split()  # "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    specs = sorted(path.stem for path in DEVICES_DIR.glob("*.yaml") if path.stem != "cpu")
    for spec in specs:
        if spec in words:
            return spec
    raise ValueError(f"no spec in configs/devices/ for the GPU {' '.join(words)!r} (specs: {', '.join(specs)})")


@dataclass(frozen=True)
class RealRun:
    latencies: np.ndarray  # (TTFT, TPOT) per request
    steps: dict[int, list[TracedStep]]  # per engine process, the steps it took for the measured sessions


def measure(deployment: str, sessions: list[SimSession], model: str) -> RealRun:
    from engine.config import EngineSettings

    with tempfile.TemporaryDirectory(prefix="agentserve-steps-") as trace:
        if deployment == DEPLOYMENTS[0]:
            from engine.core.llm_engine import LLMEngine

            engine: Any = LLMEngine(model, EngineSettings(num_threads=1, step_trace_dir=trace))
            step = in_process(engine)
        else:
            from engine.workers.coordinator.worker_engine import WorkerEngine
            from engine.workers.deployment import DeploymentSettings

            engine = WorkerEngine(model, EngineSettings(step_trace_dir=trace),
                                         DeploymentSettings(prefill=1, decode=1, transport="shm"))
            step = through_processes(engine)
        try:
            warm_up(engine)
            since = time.monotonic()
            latencies = np.array(play(engine, sessions, engine.config.vocab_size, TTL_S, step))
        finally:
            engine.shutdown()
        return RealRun(latencies, read_steps(trace, since))


def warm_up(engine: Any) -> None:
    """Untimed requests before the measured ones, as a serving benchmark warms up: the first forward passes
    (torch's first calls, first allocations) and, disaggregated, the first KV transfer and the first pinned
    session otherwise fall on the first measured turns; the profile the simulator is fitted on is warm. The
    prompts are longer than conditional disaggregation prefills locally, so the transfer path runs too; the
    prefix cache is emptied after them."""
    from engine.core.sampling.sampler import SamplingParams

    rng = np.random.default_rng(12345)
    vocab = engine.config.vocab_size
    longest = engine.max_model_len - WARM_UP_OUTPUT_TOKENS - 1
    prompts = [rng.integers(10, vocab - 1, size=min(length, longest)).tolist() for length in WARM_UP_PROMPT_TOKENS]
    engine.generate(prompts, SamplingParams(max_tokens=WARM_UP_OUTPUT_TOKENS, temperature=0.0))
    if not engine.reset_prefix_cache():
        raise RuntimeError("the warm-up requests still hold KV blocks")


def run_order(repeats: int) -> list[tuple[str, float]]:
    """The real runs in the order they are taken: every (deployment, rate) once, then again, `repeats` times."""
    return [(deployment, rate) for _ in range(repeats) for deployment in DEPLOYMENTS for rate in RATES]


def validate(calibration: Path, seed: int = 0, repeats: int | None = None, duration_s: float | None = None
             ) -> dict[str, Any]:
    """The real runs use the calibration's model."""
    repeats = REPEATS if repeats is None else repeats
    duration_s = DURATION_S if duration_s is None else duration_s
    if repeats < 1 or duration_s <= 0:
        raise ValueError("--repeats must be at least 1 and --duration above 0")
    workloads = {rate: from_workload(swe.build(seed=seed, rate=rate, duration_s=duration_s,
                                               max_requests=MAX_REQUESTS)) for rate in RATES}
    if empty := [rate for rate, sessions in workloads.items() if not sessions]:
        raise ValueError(f"--duration {duration_s:g} starts no swe session at {empty[0]:g} sessions/s")
    fitted = Calibration.load(calibration)  # a file that is not one fails before the real runs, not after them
    model = fitted.model
    measured = real_runs(workloads, model, repeats)
    rows, steps = [], []
    for (deployment, rate), runs in measured.items():
        predicted = predict(measured_cluster(deployment, calibration, model), workloads[rate])
        rows += figure_rows(deployment, rate, predicted, [run.latencies for run in runs])
        steps += step_rows(fitted, deployment, rate, runs)
    at_speed = at_run_speed(fitted, workloads, measured, model)
    datasheet = on_datasheet(workloads, measured, model)
    return {"validation": {"max_relative_error": max_error(rows), "rows": rows, "steps": steps,
                           "at_run_speed": at_speed, "datasheet": datasheet, "calibration": str(calibration),
                           "model": model, "rates": RATES, "duration_s": duration_s, "max_requests": MAX_REQUESTS,
                           "repeats": repeats},
            "notes": ["Measured on this machine while other work may have run on it: the real runs' timings carry "
                      "that load (see machine.load_average).",
                      f"Each real run was taken {repeats} times, in turn; a figure is measured on the requests of "
                      "its runs pooled, and each run's own figure is in `runs`.",
                      "`steps`: each run's engine steps, as traced, against the calibration's time for the same "
                      "batches (idle penalty and co-run factor included), per step kind. A ratio away from 1 is "
                      "the host running the run at another speed than the profile, or the step model missing "
                      "something: the run's figures carry it whatever the simulator schedules.",
                      "`at_run_speed`: every figure predicted again with the calibration's step time scaled, per "
                      "step kind, to the speed the host ran that deployment and rate's runs at (their traced steps "
                      "pooled; `factors`). It takes the host's drift since the profile out of the error, leaving "
                      "the simulator's own (scheduling, routing, queueing). It is fitted on the runs' steps, so it "
                      "is not the validation's figure: `max_relative_error` is.",
                      "`datasheet`: every figure predicted from the device's datasheet alone (the roofline of "
                      "`configs/devices/`, no calibration), as the simulator predicts the clusters no run here has."],
            "tables": [_table(rows), _steps_table(steps),
                       _table(at_speed["rows"], "At the runs' own step speed: predicted against measured (ms)"),
                       _table(datasheet["rows"], "From the device's datasheet alone: predicted against measured (ms)")]}


Key = tuple[str, float]


def at_run_speed(calibration: Calibration, workloads: dict[float, list[SimSession]],
                 measured: dict[Key, list[RealRun]], model: str) -> dict[str, Any]:
    """The figures predicted with the calibration's step time scaled to each deployment and rate's runs
    (`step_agreement.run_speed`), against the same measured figures."""
    rows, factors = [], []
    with tempfile.TemporaryDirectory(prefix="agentserve-speed-") as folder:
        path = Path(folder) / "calibration.json"
        for (deployment, rate), runs in measured.items():
            speed = run_speed(calibration, [run.steps for run in runs], deployment != DEPLOYMENTS[0])
            calibration.scaled(speed).save(path)
            rows += figure_rows(deployment, rate, predict(measured_cluster(deployment, path, model), workloads[rate]),
                                [run.latencies for run in runs])
            factors.append({"deployment": deployment, "rate": rate, **speed})
    return {"max_relative_error": max_error(rows), "rows": rows, "factors": factors}


def on_datasheet(workloads: dict[float, list[SimSession]], measured: dict[Key, list[RealRun]], model: str
                 ) -> dict[str, Any]:
    """The figures predicted on the roofline of the device's datasheet, no calibration, against the same measured
    figures."""
    rows = [row for (deployment, rate), runs in measured.items() for row in figure_rows(
        deployment, rate, predict(measured_cluster(deployment, None, model), workloads[rate]),
        [run.latencies for run in runs])]
    return {"max_relative_error": max_error(rows), "rows": rows}


def max_error(rows: list[dict[str, Any]]) -> float:
    return max(row["relative_error"] for row in rows)


def predict(cluster: ClusterConfig, sessions: list[SimSession]) -> np.ndarray:
    """The simulated requests' (TTFT, TPOT) rows."""
    simulated, _ = simulate(cluster, sessions)
    return np.array([(r.ttft_s, r.tpot_s) for r in simulated.log.requests])


def real_runs(workloads: dict[float, list[SimSession]], model: str, repeats: int) -> dict[Key, list[RealRun]]:
    """Every real run of `run_order`: its requests' (TTFT, TPOT) rows and its engine steps."""
    measured: dict[Key, list[RealRun]] = {}
    order = run_order(repeats)
    with Progress(transient=True) as progress:
        task = progress.add_task("real runs", total=len(order))
        for deployment, rate in order:
            progress.update(task, description=f"real run: {deployment}, {rate} sessions/s")
            measured.setdefault((deployment, rate), []).append(measure(deployment, workloads[rate], model))
            progress.advance(task)
    return measured


def figure_rows(deployment: str, rate: float, predicted: np.ndarray, runs: list[np.ndarray]) -> list[dict[str, Any]]:
    """One row per figure: predicted, measured on every run's (TTFT, TPOT) rows pooled, and each run's own."""
    pooled = np.concatenate(runs)
    rows = []
    for column, metric in enumerate(("ttft", "tpot")):
        for quantile in (50, 90):
            p, m = (float(np.percentile(a[:, column], quantile)) for a in (predicted, pooled))
            rows.append({"deployment": deployment, "rate": rate, "figure": f"{metric}_p{quantile}_s",
                         "predicted": p, "measured": m, "relative_error": _error(p, m), "requests": len(runs[0]),
                         "runs": [float(np.percentile(run[:, column], quantile)) for run in runs]})
    return rows


def step_rows(calibration: Calibration, deployment: str, rate: float, runs: list[RealRun]) -> list[dict[str, Any]]:
    """Per run and step kind, its traced steps against the calibration (`step_agreement.agreement`)."""
    worker_process = deployment != DEPLOYMENTS[0]
    return [{"deployment": deployment, "rate": rate, "run": index, "kind": name, **figures}
            for index, run in enumerate(runs, 1)
            for name, figures in agreement(calibration, run.steps, worker_process).items()]


def _error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured else float("inf")


def _table(rows: list[dict[str, Any]], title: str = "Predicted against measured (ms)") -> Table:
    cells = [[r["deployment"], f"{r['rate']}", r["figure"], f"{1000 * r['predicted']:.1f}",
              f"{1000 * r['measured']:.1f}", ", ".join(f"{1000 * run:.1f}" for run in r["runs"]),
              f"{100 * r['relative_error']:.1f}%"] for r in rows]
    return Table(title, ["deployment", "sessions/s", "figure", "predicted", "measured", "each run", "error"], cells)


def _steps_table(rows: list[dict[str, Any]]) -> Table:
    cells = [[r["deployment"], f"{r['rate']}", f"{r['run']}", r["kind"], f"{r['steps']}",
              f"{r['measured_s']:.2f}", f"{r['predicted_s']:.2f}", f"{r['ratio']:.3f}"] for r in rows]
    return Table("The runs' engine steps against the calibration (seconds, summed)",
                 ["deployment", "sessions/s", "run", "step kind", "steps", "measured", "predicted",
                  "measured / predicted"], cells)
