"""The workload of `agentserve bench --workload NAME`: `agents_eval.workloads.NAME.build(...)`, sized for the
model under test (its tokenizer and context length), and the short warm-up session each gateway gets first."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agents_eval.workloads.types import APPEND, Workload
from engine.model.loader import load_tokenizer, resolve_model
from engine.model.tokenizer import Tokenizer

WORKLOADS = ("mooncake", "webarena", "swe", "coding-agent")
WARM_UP_SYSTEM = "You are the warm-up agent of a benchmark; your sessions are never measured."


@dataclass(frozen=True)
class WorkloadOptions:
    name: str
    seed: int = 0
    rate: float | None = None  # the builder's own default when None
    duration_s: float = 60.0
    max_requests: int | None = None
    length_scale: float | None = None
    time_scale: float | None = None


def builder(name: str) -> ModuleType:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    try:
        return importlib.import_module(f"agents_eval.workloads.{name.replace('-', '_')}")
    except ModuleNotFoundError as error:
        if error.name != f"agents_eval.workloads.{name.replace('-', '_')}":
            raise
        raise ValueError(f"workload {name!r} is not available (agents_eval/workloads/{name}.py)") from None


def default_rate(name: str) -> float | None:
    """The builder's default sessions per second; None where it replays a trace's own arrival times."""
    rate = inspect.signature(builder(name).build).parameters.get("rate")
    return float(rate.default) if rate is not None and isinstance(rate.default, int | float) else None


def session_rate(workload: Workload, duration_s: float) -> float:
    """Sessions per second that start within the run: the offered rate of a trace replayed at its own times."""
    return sum(s.start_s < duration_s for s in workload.sessions) / duration_s


def model_context(model: str) -> tuple[Tokenizer | None, int]:
    """The model's tokenizer (None: the built-in one) and context length, without loading its weights."""
    source = resolve_model(model)
    tokenizer = None if source.checkpoint is None else load_tokenizer(source.checkpoint)
    return tokenizer, source.config.max_position_embeddings


def build_workload(options: WorkloadOptions, model: str, rate: float | None) -> Workload:
    """The builder's sessions at `rate`; only the options the builder takes are passed (None: its default)."""
    build = builder(options.name).build
    tokenizer, max_model_len = model_context(model)
    wanted: dict[str, Any] = {"seed": options.seed, "rate": rate, "duration_s": options.duration_s,
                              "max_requests": options.max_requests, "length_scale": options.length_scale,
                              "time_scale": options.time_scale, "tokenizer": tokenizer,
                              "max_model_len": max_model_len}
    accepted = inspect.signature(build).parameters
    nullable = {"max_requests", "tokenizer"}  # None means something to the builders: no cap, built-in
    kwargs = {k: v for k, v in wanted.items() if k in accepted and (v is not None or k in nullable)}
    workload: Workload = build(**kwargs)
    return workload


@dataclass(frozen=True)
class WarmUpTurn:
    new_messages: tuple[dict[str, str], ...]
    max_output_tokens: int = 8
    at_s: float | None = None
    tool_gap_s: float = 0.0
    phase: str = "act"
    history: str = APPEND


@dataclass(frozen=True)
class WarmUpSession:
    turns: tuple[WarmUpTurn, ...]
    session_id: str = "bench-warm-up"
    start_s: float = 0.0
    system: str = WARM_UP_SYSTEM


@dataclass(frozen=True)
class WarmUp:
    """A short session of its own (its own system prompt: it primes no cache the measured sessions use)."""

    sessions: tuple[WarmUpSession, ...]
    name: str = "warm-up"


def warm_up_workload(turns: int) -> WarmUp:
    steps = tuple(WarmUpTurn(({"role": "user", "content": f"Warm-up step {i}: list the files, then run the tests."},))
                  for i in range(turns))
    return WarmUp((WarmUpSession(steps),))
