"""The gateway's time per chat request, step by step: what `trajectory.step_timer` records inside the server
for each request the benchmark tags, summarized per concurrency level as mean, p50 and share of the gateway's
own time (every step but the engine's).

Admission and the metrics are timed from outside their code: `instrumented` wraps the gateway state's
admission controller, metrics and load signals, the benchmark's server only, so that their calls from
`gateway.api.generation` count as steps of their own instead of as engine time. The probes and wrappers cost time
themselves (about 0.1-0.2 ms a request at concurrency 1), so the steps come from waves of their own, after
the latency waves, which run without them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from agents_eval.harness.report import Table
from agents_eval.harness.stats import percentile
from gateway.server.state import GatewayState
from trajectory import step_timer

ENGINE_STEP = "engine"
_CLASS_METHOD = object()  # a wrapped method that was the class's, not an attribute of the instance
STEPS = {  # name -> what it covers, in the order a request meets them
    "parse": "parse + validate: routing, body, JSON, pydantic, auth (FastAPI, before the handler)",
    "session_load": "session load: lock, store, restore, which messages are new",
    "render_tokenize": "chat template render + tokenization (new messages, assistant header, reply)",
    "plan": "trajectory planning: pruning, masks, phase, prompt ids, budget, sampling params",
    "admit": "admission control",
    ENGINE_STEP: "engine: hand-off and waiting for its outputs (not gateway work)",
    "metrics": "metrics and load signals",
    "outputs": "per-output handling: chunks, usage",
    "serialize": "JSON / SSE serialization",
    "session_save": "session save: record the reply, serialize, store",
    "send": "hand-off to uvicorn (socket writes)",
    "other": "the rest: Starlette/FastAPI plumbing, handler glue, loop scheduling",
}
TIMED_CALLS = {  # GatewayState attribute -> (its methods to time, the step they count as)
    "admission": (("check", "on_admit", "on_first_token", "on_finish", "observe_prefill", "observe_tokens"), "admit"),
    "metrics": (("request_started", "handed_to_engine", "first_token", "token", "finished", "turn"), "metrics"),
    "signals": (("expected_output_tokens", "turn_started", "turn_finished"), "metrics"),
}


@contextlib.contextmanager
def instrumented(state: GatewayState) -> Iterator[None]:
    """Time the admission controller's, metrics' and load signals' calls as steps while the block runs
    (instance attributes that wrap the methods they have, removed afterwards: a wrapper costs every call)."""
    wrapped: list[tuple[object, str, object]] = []  # (target, method, its own attribute before, if any)
    for attribute, (methods, step) in TIMED_CALLS.items():
        target = getattr(state, attribute)
        for method in methods:
            if callable(getattr(target, method, None)):
                wrapped.append((target, method, vars(target).get(method, _CLASS_METHOD)))
                setattr(target, method, _timed(getattr(target, method), step))
    try:
        yield
    finally:
        for target, method, before in reversed(wrapped):
            if before is _CLASS_METHOD:
                delattr(target, method)
            else:
                setattr(target, method, before)


def _timed(method: Callable[..., Any], step: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        step_timer.enter(step)
        try:
            return method(*args, **kwargs)
        finally:
            step_timer.leave(step)

    return timed


def summarize(samples: list[dict[str, int]]) -> dict[str, Any]:
    """Per step: mean, p50 and p99 in microseconds, and its share of the gateway's own time (mean over
    requests of every step but the engine's)."""
    names = [name for name in STEPS if any(name in s for s in samples)]
    names += sorted({name for s in samples for name in s} - set(names))
    us = {name: np.asarray([s.get(name, 0) for s in samples]) / 1000.0 for name in names}
    own = [name for name in names if name != ENGINE_STEP]
    own_mean = float(sum(us[name].mean() for name in own)) if samples else 0.0
    steps = {name: {"mean_us": float(values.mean()), "p50_us": percentile(values.tolist(), 50),
                    "p99_us": percentile(values.tolist(), 99),
                    "share": float(values.mean()) / own_mean if name != ENGINE_STEP and own_mean else None}
             for name, values in us.items()}
    total = np.asarray([sum(s.get(name, 0) for name in own) for s in samples]) / 1000.0
    return {"requests": len(samples), "steps": steps, "gateway_mean_us": own_mean,
            "gateway_p50_us": percentile(total.tolist(), 50) if samples else 0.0}


def steps_table(levels: dict[str, dict[str, Any]]) -> Table:
    """One row per step, mean and share at each concurrency level."""
    keys = list(levels)
    names = list(dict.fromkeys(name for key in keys for name in levels[key]["steps"]["steps"]))
    rows = []
    for name in names:
        row = [name, STEPS.get(name, "")]
        for key in keys:
            figures = levels[key]["steps"]["steps"].get(name)
            share = figures and figures["share"]
            row += [f"{figures['mean_us']:.0f}" if figures else "",
                    f"{100 * share:.1f}%" if share is not None and figures else ""]
        rows.append(row)
    totals = ["gateway (all but engine)", "sum of the steps above, engine excluded"]
    cpu = ["gateway thread CPU", "per request (uvicorn, app, output delivery; time.thread_time)"]
    for key in keys:
        totals += [f"{levels[key]['steps']['gateway_mean_us']:.0f}", "100%"]
        cpu += [f"{1e6 * levels[key]['gateway_cpu_s_per_request']:.0f}", ""]
    headers = ["step", "covers"]
    for key in keys:
        headers += [f"{key} mean us", f"{key} share"]
    return Table("Gateway time per chat request, by step (inside the server)", headers, [*rows, totals, cpu])
