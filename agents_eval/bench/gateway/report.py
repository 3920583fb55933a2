"""Figures, tables and the per-turn latency chart of `agentserve bench gateway`."""

from __future__ import annotations

import statistics
from typing import Any

from agents_eval.bench.gateway.session import CHAT, WS, SessionRun
from agents_eval.harness.report import LineChart, Table
from agents_eval.harness.report import goal as report_goal

OVERHEAD_GOAL_MS = 1.0  # p50, end to end; LiteLLM's proxy publishes 2-12 ms p50
MODE_LABELS = {WS: "Responses WebSocket (new input only)", CHAT: "HTTP chat (whole history resent)"}


def summarize_mode(runs: list[SessionRun]) -> dict[str, Any]:
    """The per-turn curve (mean over sessions), mean and p50 over every turn, the last turn; tokens of session 1."""
    curve = [1000.0 * statistics.fmean(turn) for turn in zip(*(r.latency_s for r in runs), strict=True)]
    every = [1000.0 * s for r in runs for s in r.latency_s]
    first = runs[0]
    return {
        "turn_latency_ms": curve,
        "mean_ms": statistics.fmean(every),
        "p50_ms": statistics.median(every),
        "last_turn_ms": curve[-1],
        "prompt_tokens": first.prompt_tokens,
        "cached_tokens": first.cached_tokens,
        "prefilled_tokens": [p - c for p, c in zip(first.prompt_tokens, first.cached_tokens, strict=True)],
        "output_tokens": first.output_tokens,
        "sessions_latency_ms": [[1000.0 * s for s in r.latency_s] for r in runs],
    }


def summarize_sessions(runs: dict[str, list[SessionRun]]) -> dict[str, Any]:
    modes = {mode: summarize_mode(runs[mode]) for mode in (WS, CHAT)}
    ratio = {key: modes[CHAT][key] / modes[WS][key] for key in ("mean_ms", "p50_ms", "last_turn_ms")}
    return {**modes, "chat_over_ws": ratio}


def goal(overhead: dict[str, Any]) -> dict[str, Any]:
    met = {key: level["p50"]["overhead_ms"] <= OVERHEAD_GOAL_MS for key, level in overhead["levels"].items()}
    return {"p50_overhead_ms": OVERHEAD_GOAL_MS, "met": met}


def goals(overhead: dict[str, Any]) -> list[dict[str, Any]]:
    """The gateway's p50 overhead over the engine-only path at each concurrency, at most OVERHEAD_GOAL_MS."""
    return [report_goal(f"p50 overhead over the engine path at concurrency {key} (ms)", OVERHEAD_GOAL_MS, "max",
                        level["p50"]["overhead_ms"]) for key, level in overhead["levels"].items()]


def _ms(value: float) -> str:
    return f"{value:.2f}"


def overhead_table(overhead: dict[str, Any]) -> Table:
    rows = []
    for level in overhead["levels"].values():
        for q in ("p50", "p99"):
            f = level[q]
            paired = _ms(level["paired_overhead_p50_ms"]) if q == "p50" else ""
            rows.append([str(level["concurrency"]), q, str(level["samples"]), _ms(f["engine_ms"]),
                         _ms(f["gateway_ms"]), _ms(f["overhead_ms"]), paired, _ms(f["gateway_server_ms"]),
                         _ms(f["overhead_in_app_ms"]), _ms(f["client_and_socket_ms"])])
    headers = ["concurrency", "quantile", "requests", "engine ms", "gateway (client) ms", "overhead ms",
               "paired overhead ms", "gateway (in app) ms", "overhead in app ms", "client + socket ms"]
    return Table("Gateway overhead: chat completions through the gateway vs the engine alone", headers, rows)


def session_summary_table(session: dict[str, Any]) -> Table:
    rows = []
    for mode in (WS, CHAT):
        f = session[mode]
        rows.append([MODE_LABELS[mode], _ms(f["mean_ms"]), _ms(f["p50_ms"]), _ms(f["last_turn_ms"]),
                     str(sum(f["prompt_tokens"])), str(sum(f["cached_tokens"])), str(sum(f["prefilled_tokens"]))])
    ratio = session["chat_over_ws"]
    rows.append(["chat / WebSocket", f"{ratio['mean_ms']:.2f}x", f"{ratio['p50_ms']:.2f}x",
                 f"{ratio['last_turn_ms']:.2f}x", "", "", ""])
    headers = ["mode", "mean ms/turn", "p50 ms/turn", "last turn ms", "prompt tokens", "cached tokens",
               "prefilled tokens"]
    return Table("Agent session: per-turn latency", headers, rows)


def per_turn_table(session: dict[str, Any]) -> Table:
    ws, chat = session[WS], session[CHAT]
    rows = []
    for turn, (ws_ms, chat_ms) in enumerate(zip(ws["turn_latency_ms"], chat["turn_latency_ms"], strict=True)):
        rows.append([str(turn + 1), _ms(ws_ms), _ms(chat_ms), f"{chat_ms / ws_ms:.2f}",
                     str(ws["prompt_tokens"][turn]), str(ws["cached_tokens"][turn]),
                     str(chat["prompt_tokens"][turn]), str(chat["cached_tokens"][turn])])
    headers = ["turn", "WebSocket ms", "chat ms", "chat / WS", "WS prompt tok", "WS cached tok",
               "chat prompt tok", "chat cached tok"]
    return Table("Per turn (latency: mean over sessions; tokens: the first session)", headers, rows)


def turn_chart(session: dict[str, Any], title: str) -> LineChart:
    turns = range(1, len(session[WS]["turn_latency_ms"]) + 1)
    series = {MODE_LABELS[mode]: session[mode]["turn_latency_ms"] for mode in (WS, CHAT)}
    return LineChart("turn_latency.png", title, "turn", "latency per turn (ms)", list(turns), series, integer_x=True)


def notes(overhead: dict[str, Any], load_before: float, load_after: float, cpus: int,
          engine_in_process: bool = False) -> list[str]:
    p50 = {level["concurrency"]: level["p50"]["overhead_ms"] for level in overhead["levels"].values()}
    floor = overhead["client_floor"]
    goal = ", ".join(f"{ms:.2f} ms at concurrency {c}" for c, ms in p50.items())
    lines = [f"p50 gateway overhead (client-observed gateway minus engine): {goal}; goal <= {OVERHEAD_GOAL_MS} ms "
             "(LiteLLM's proxy publishes 2-12 ms p50).",
             "Gateway (uvicorn thread as `agentserve serve` runs it, no access log) in one Python process, "
             + ("the engine on a thread of it (--engine-in-process); " if engine_in_process else
                "the engine in a worker process of its own (pipes between them); ")
             + "the clients run in another (aiohttp, a kept-alive connection per concurrent request; openai SDK). "
             "The engine path runs on the gateway's own event loop; the two paths alternate wave by wave (a wave: "
             "`concurrency` requests) on the same engine, never at once. Admission control runs with a TTFT SLO "
             "too large to refuse anything.",
             "Overhead is a difference of quantiles of the two paths; 'paired' is the median over requests of each "
             "request's gateway time minus its engine time in the same wave; 'client + socket' is per request the "
             "client-observed time minus the time inside the app (aiohttp, loopback, uvicorn's HTTP parsing). "
             f"Client floor: `GET /health` one at a time takes {floor['p50_ms']:.2f} ms p50, "
             f"{floor['p99_ms']:.2f} ms p99 with the same aiohttp client.",
             "Agent session: turns back to back (no tool gap); each WebSocket session's connection is opened "
             "before its first turn is timed. Clients: the openai SDK's `responses.connect()` for the WebSocket "
             "(it parses every stream event into models), aiohttp for chat (the SDK's request building grows with "
             "the resent history), both on uvloop in the client process."]
    if max(load_before, load_after) > 0.5 * cpus:
        lines.append(f"The machine was busy (load average {load_before:.1f} before, {load_after:.1f} after, "
                     f"{cpus} CPUs): sub-millisecond figures are noisy; compare ratios within this run.")
    return lines
