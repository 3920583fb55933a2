"""A per-step trace of the engine (`EngineSettings.step_trace_dir`): one JSON line per step in
`<dir>/steps-<pid>.jsonl`, so every engine process of a deployment writes its own file.

A line: `start` (time.monotonic() seconds, one clock for every process of the host), `seconds` (the whole
`LLMEngine.step`, scheduling and output processing included, as `agentserve profile` times it), `cpu_s` (the CPU
time of the engine's thread over the same span: below `seconds` when the host's cores are shared, as the step
waited for one), `idle_s` (since the end of this engine's previous step; null for its first) and `batch`: per
scheduled sequence `[new tokens, tokens already in KV, whether it samples a token]`. `agentserve simulate
--validate` reads the runs' steps and sets them against what its calibration predicts for the same batches."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

Items = list[tuple[int, int, bool]]  # per sequence: new tokens, tokens already in KV, samples a token


@dataclass(frozen=True)
class TracedStep:
    start: float
    seconds: float
    idle_s: float | None
    batch: Items
    cpu_s: float | None = None  # None in a trace written before the field


class StepTrace:
    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self._file = (path / f"steps-{os.getpid()}.jsonl").open("a", encoding="utf-8")
        self._last_end: float | None = None

    def record(self, start: float, seconds: float, items: Items, cpu_s: float) -> None:
        idle = None if self._last_end is None else max(0.0, start - self._last_end)
        line = {"start": start, "seconds": seconds, "cpu_s": cpu_s, "idle_s": idle, "batch": items}
        self._file.write(json.dumps(line) + "\n")
        self._last_end = start + seconds

    def close(self) -> None:
        self._file.close()


def read_steps(directory: str | Path, since: float = float("-inf")) -> dict[int, list[TracedStep]]:
    """Every traced step that started at `since` or later, per engine process id, in order."""
    steps: dict[int, list[TracedStep]] = {}
    for path in sorted(Path(directory).glob("steps-*.jsonl")):
        pid = int(path.stem.removeprefix("steps-"))
        for line in path.read_text(encoding="utf-8").splitlines():
            data = json.loads(line)
            if data["start"] >= since:
                batch = [(int(new), int(cached), bool(samples)) for new, cached, samples in data["batch"]]
                step = TracedStep(data["start"], data["seconds"], data["idle_s"], batch, data.get("cpu_s"))
                steps.setdefault(pid, []).append(step)
    return steps
