"""Single-stream decode of the quantized model served through the gateway (`agentserve serve`, bench peer's
client and configuration) against the same engine stepping in this process, and where the served stream's
time goes: the served engine's own step trace splits each token's time into the step (`seconds`, of which
`cpu_s` on a core) and the gap between steps (`idle_s`: the engine waiting for the serving path). Rounds
alternate, so a busy host's load falls on both alike.

    .venv/bin/python scripts/single_stream_decode.py [--threads 1] [--rounds 2] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agents_eval.bench.peer.engine_step import decode_steps_s, engine_for
from agents_eval.bench.peer.measure import Target, decode, warm_up
from agents_eval.bench.peer.servers import running_server
from agents_eval.bench.peer.settings import AGENTSERVE_QUANTIZED, PeerSettings


def served_round(settings: PeerSettings, folder: Path) -> dict[str, Any]:
    """Served tokens/s (median of the repeats) and the served engine's decode steps, from its step trace."""
    trace = folder / "trace"
    with running_server(AGENTSERVE_QUANTIZED, settings, None, folder) as server:
        target = Target(server.url, settings.model, keeps_sessions=True)
        asyncio.run(warm_up(target))
        start = time.monotonic()  # the trace's clock: the warm-up's steps are before it
        result = asyncio.run(decode(target, settings, lambda: None))
    lines = [json.loads(line) for path in trace.glob("*.jsonl") for line in path.read_text().splitlines()]
    steps = [step for step in lines if step["start"] > start]
    decodes = [s for s in steps if len(s["batch"]) == 1 and s["batch"][0][0] == 1 and s["idle_s"] is not None]
    return {"tokens_per_s": result["tokens_per_s"], "step_s": statistics.median(s["seconds"] for s in decodes),
            "cpu_s": statistics.median(s["cpu_s"] for s in decodes),
            "gap_s": statistics.median(s["idle_s"] for s in decodes), "steps": len(decodes),
            # on a busy host a few steps wait long for a core: the mean, not the median, sets the tokens/s
            "mean_step_s": statistics.mean(s["seconds"] for s in decodes),
            "mean_gap_s": statistics.mean(s["idle_s"] for s in decodes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    settings = PeerSettings(threads=args.threads, decode_tokens=args.tokens, repeats=args.repeats,
                            configs=(AGENTSERVE_QUANTIZED,))
    folder = Path(tempfile.mkdtemp(prefix="single-stream-"))
    os.environ["AGENTSERVE_ENGINE_STEP_TRACE_DIR"] = str(folder / "trace")  # the served engine's, inherited
    for round_index in range(args.rounds):
        served = served_round(settings, folder)
        os.environ.pop("AGENTSERVE_ENGINE_STEP_TRACE_DIR")
        engine = engine_for(AGENTSERVE_QUANTIZED, settings.model, args.threads)
        os.environ["AGENTSERVE_ENGINE_STEP_TRACE_DIR"] = str(folder / "trace")
        decode_steps_s(engine, 60, 4)  # warm-up
        in_process = statistics.median(decode_steps_s(engine, 60, args.tokens))
        engine.shutdown()
        print(f"round {round_index}: served {served['tokens_per_s']:.1f} tok/s (its engine: step "
              f"{served['step_s'] * 1e3:.1f} ms, on a core {served['cpu_s'] * 1e3:.1f} ms, gap between steps "
              f"{served['gap_s'] * 1e3:.1f} ms, {served['steps']} steps; means: step "
              f"{served['mean_step_s'] * 1e3:.1f} ms, "
              f"gap {served['mean_gap_s'] * 1e3:.1f} ms); in-process step {in_process * 1e3:.1f} ms "
              f"({1 / in_process:.1f} tok/s); 1-minute load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
