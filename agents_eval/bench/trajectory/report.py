"""The trajectory benchmark's figures as JSON, markdown tables, a totals bar chart and a per-turn line plot."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from agents_eval.bench.trajectory.phase import PhaseFigures, think_label
from agents_eval.bench.trajectory.sessions import REPLY_TOKENS, SessionRun
from agents_eval.bench.trajectory.synthetic_outputs import PruningFigure
from agents_eval.bench.trajectory.trace import ReplayCounts, ScaledRequest
from agents_eval.harness.report import BarChart, Table, goal
from engine.kv_cache.pins import PinStats

GOAL_REDUCTION = 10.0
PER_TURN_CHART = "prefill_per_turn.png"
TOTALS_CHART = "prefill_totals.png"
CACHE_ON, CACHE_OFF = "prefix_caching_on", "prefix_caching_off"
KV_FORMULA = "2 * num_hidden_layers * num_key_value_heads * head_dim * dtype bytes"
NOTES = (
    "Trace replay is a token-count benchmark: arrival timestamps are not honoured; requests run in trace "
    "order with a fixed number in flight, and their lengths are scaled (and clipped to the model's context).",
    "Synthetic sessions share one system prompt, so from the second session on the first turn finds it in the "
    "prefix cache; later turns reuse the session's pinned KV and prefill only the turn delta.",
    "The synthetic requests are recorded and replayed without a session, turn by turn as recorded and each "
    "generating its reply: with prefix caching off (full recompute, measured) and on (prefix caching only, which "
    "finds every full block of the history but not the partly filled last one). Turn-delta reuse is credited with "
    "its reduction over prefix caching only; its reduction over full recompute includes prefix caching's.",
)


@dataclass(frozen=True)
class TraceFigures:
    requests: list[ScaledRequest]
    block_tokens: int
    runs: dict[str, ReplayCounts]  # CACHE_OFF, CACHE_ON

    def to_json(self) -> dict[str, Any]:
        prompt_tokens = sum(len(r.prompt) for r in self.requests)
        reusable = sum(r.reusable_tokens for r in self.requests)
        runs = {key: asdict(run) | {"hit_ratio": run.hit_ratio} for key, run in self.runs.items()}
        return {"requests": len(self.requests), "sessions": len({r.session for r in self.requests}),
                "continuing_requests": len(self.requests) - len({r.session for r in self.requests}),
                "clipped_to_context": sum(r.clipped for r in self.requests), "block_tokens": self.block_tokens,
                "prompt_tokens": prompt_tokens, "output_tokens": sum(r.output_tokens for r in self.requests),
                "reusable_tokens_upper_bound": reusable, "hit_ratio_upper_bound": reusable / prompt_tokens,
                **runs, "reduction": self.runs[CACHE_OFF].computed_tokens / self.runs[CACHE_ON].computed_tokens}


@dataclass(frozen=True)
class Figures:
    sessions: list[SessionRun]
    replays: dict[str, list[int]]  # CACHE_OFF, CACHE_ON: the recorded requests without a pin, per turn index
    pins: PinStats
    kv_bytes_per_token: int
    trace: TraceFigures
    pruning: dict[str, PruningFigure]
    phase: PhaseFigures

    def per_turn(self) -> tuple[list[int], list[int]]:
        """Per turn index, over all sessions: tokens full recompute prefills, tokens turn-delta reuse did."""
        turns = max(len(run.turns) for run in self.sessions)
        full, delta = [0] * turns, [0] * turns
        for run in self.sessions:
            for index, turn in enumerate(run.turns):
                full[index] += turn.prompt_tokens
                delta[index] += turn.computed_tokens
        return full, delta

    @property
    def reduction(self) -> float:
        """Turn-delta reuse against full recompute."""
        full, delta = self.per_turn()
        return sum(full) / sum(delta)

    @property
    def reduction_over_prefix_caching(self) -> float:
        """Turn-delta reuse against the same requests with prefix caching and no pin: the pins' own share."""
        return sum(self.replays[CACHE_ON]) / sum(self.per_turn()[1])


def _synthetic_json(figures: Figures) -> dict[str, Any]:
    full, delta = figures.per_turn()
    no_cache, prefix_caching = figures.replays[CACHE_OFF], figures.replays[CACHE_ON]
    observations = [t.observation_tokens for run in figures.sessions for t in run.turns if t.observation_tokens]
    return {
        "sessions": len(figures.sessions), "turns_run": [len(run.turns) for run in figures.sessions],
        "sessions_cut_short": sum(run.cut_short for run in figures.sessions),
        "prefill_tokens_full_recompute": sum(full), "prefill_tokens_turn_delta": sum(delta),
        "prefill_tokens_measured_no_cache": sum(no_cache), "prefill_tokens_prefix_caching": sum(prefix_caching),
        "measured_no_cache_equals_full_recompute": sum(no_cache) == sum(full),
        "reduction": figures.reduction, "reduction_over_prefix_caching": figures.reduction_over_prefix_caching,
        "prefix_caching_reduction": sum(full) / sum(prefix_caching),
        "goal_reduction": GOAL_REDUCTION, "goal_met": figures.reduction >= GOAL_REDUCTION,
        "per_turn": {"full_recompute": full, "measured_no_cache": no_cache, "prefix_caching": prefix_caching,
                     "turn_delta": delta},
        "observation_tokens_mean": {"before_pruning": mean(o[0] for o in observations) if observations else None,
                                    "after_pruning": mean(o[1] for o in observations) if observations else None},
        "session_pins": asdict(figures.pins),
    }


def _kv_json(figures: Figures) -> dict[str, Any]:
    per_token = figures.kv_bytes_per_token
    delta = [run.final_tokens * per_token for run in figures.sessions]
    snapshots = [sum(t.prompt_tokens for t in run.turns) * per_token for run in figures.sessions]
    return {"bytes_per_token": per_token, "formula": KV_FORMULA,
            "turn_delta_bytes_per_session": delta, "snapshot_per_turn_bytes_per_session": snapshots,
            "turn_delta_bytes_mean": mean(delta), "snapshot_per_turn_bytes_mean": mean(snapshots),
            "ratio": sum(snapshots) / sum(delta)}


def report_json(figures: Figures, head: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """head: settings, engine settings, model config, machine; end: figures taken after the run."""
    pruning = {kind: asdict(f) | {"removed_share": f.removed_share} for kind, f in figures.pruning.items()}
    goals = [goal("prefill tokens, full recompute / turn delta", GOAL_REDUCTION, "min", figures.reduction)]
    return {"benchmark": "trajectory", **head, "synthetic": _synthetic_json(figures), "goals": goals,
            "kv_bytes": _kv_json(figures),
            "trace": figures.trace.to_json(), "pruning": pruning, "phase": figures.phase.to_json(), **end}


def _prefill_table(report: dict[str, Any]) -> Table:
    synthetic = report["synthetic"]
    full, cached = synthetic["prefill_tokens_full_recompute"], synthetic["prefill_tokens_prefix_caching"]
    turns = sum(synthetic["turns_run"])
    methods = [("full recompute (whole prompt every turn)", full),
               ("measured: prefix caching off, no session pin", synthetic["prefill_tokens_measured_no_cache"]),
               ("measured: prefix caching on, no session pin", cached),
               ("turn-delta reuse (prefix caching and session KV pin)", synthetic["prefill_tokens_turn_delta"])]
    rows = [[label, str(tokens), f"{tokens / turns:.0f}", f"{full / tokens:.1f}x", f"{cached / tokens:.2f}x"]
            for label, tokens in methods]
    title = f"Prefill tokens, {synthetic['sessions']} synthetic agent sessions, {turns} turns " \
            f"(goal ≥ {GOAL_REDUCTION:.0f}x over full recompute: {'met' if synthetic['goal_met'] else 'missed'})"
    return Table(title, ["method", "prefill tokens", "per turn", "reduction vs full recompute",
                         "reduction vs prefix caching only"], rows)


def _kv_table(report: dict[str, Any]) -> Table:
    kv = report["kv_bytes"]
    rows = [["turn-delta reuse (one growing KV)", f"{kv['turn_delta_bytes_mean'] / 2**20:.2f}", "1.0x"],
            ["full snapshot per turn", f"{kv['snapshot_per_turn_bytes_mean'] / 2**20:.2f}", f"{kv['ratio']:.1f}x"]]
    return Table(f"KV bytes held per session ({kv['bytes_per_token']} bytes/token = {kv['formula']})",
                 ["storage", "MiB per session (mean)", "ratio"], rows)


def _trace_tables(report: dict[str, Any], length_scale: float) -> list[Table]:
    trace = report["trace"]
    workload = Table(f"Mooncake trace replay: workload (first {trace['requests']} requests, lengths x{length_scale:g})",
                     ["requests", "sessions", "continuing", "clipped to context", "block tokens",
                      "prompt tokens", "hit ratio upper bound"],
                     [[str(trace[k]) for k in ("requests", "sessions", "continuing_requests", "clipped_to_context",
                                               "block_tokens", "prompt_tokens")]
                      + [f"{trace['hit_ratio_upper_bound']:.1%}"]])
    rows = []
    for key, label in ((CACHE_OFF, "off"), (CACHE_ON, "on")):
        run = trace[key]
        ratio = "n/a" if run["hit_ratio"] is None else f"{run['hit_ratio']:.1%}"
        reduction = trace[CACHE_OFF]["computed_tokens"] / run["computed_tokens"]
        rows.append([label, str(run["prompt_tokens"]), str(run["computed_tokens"]), ratio, f"{reduction:.2f}x"])
    replay = Table("Mooncake trace replay: prefill", ["prefix caching", "prompt tokens", "prefill tokens computed",
                                                      "hit ratio (hits/queries, tokens)", "reduction"], rows)
    return [workload, replay]


def _pruning_table(report: dict[str, Any]) -> Table:
    rows = [[kind, f["tool"], str(f["observations"]), str(f["tokens_before"]), str(f["tokens_after"]),
             f"{f['removed_share']:.1%}"] for kind, f in report["pruning"].items()]
    return Table("Tokens removed by pruning on ingest, per observation type",
                 ["observation", "tool (rules)", "observations", "tokens before", "tokens after", "removed"], rows)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.0f}"


def _phase_tables(report: dict[str, Any]) -> list[Table]:
    phase = report["phase"]
    shares = phase["script"]["think_shares"]
    rows = [[f"{think_label(shares[d['regime'] - 1])} → {think_label(shares[d['regime']])}", d["direction"],
             f"{d['first_turn_s']:.2f}", "missed" if d["detected_s"] is None else f"{d['detected_s']:.2f}",
             "" if d["delay_s"] is None else f"{1000 * d['delay_s']:.0f}"] for d in phase["detections"]]
    script = phase["script"]
    title = f"Phase shift detection ({script['sessions']} sessions, {script['segment_s']:g} s per regime, " \
            f"{phase['turns']} turns, simulated clock)"
    shifts = Table(title, ["regime change", "direction", "first turn s", "detected s", "delay ms"], rows)
    summary = Table("Phase shift detection: summary", ["events", "missed", "false events", "delay mean ms",
                                                       "delay max ms"],
                    [[str(len(phase["events"])), str(phase["missed"]), str(phase["false_events"]),
                      _ms(phase["delay_mean_s"]), _ms(phase["delay_max_s"])]])
    return [shifts, summary]


def tables(report: dict[str, Any]) -> list[Table]:
    length_scale = report["settings"]["length_scale"]
    return [_prefill_table(report), _kv_table(report), *_trace_tables(report, length_scale),
            _pruning_table(report), *_phase_tables(report)]


def notes(report: dict[str, Any]) -> list[str]:
    synthetic = report["synthetic"]
    sizes = synthetic["observation_tokens_mean"]
    context = min(report["settings"]["context_tokens"], report["model_config"]["max_position_embeddings"])
    observations = [] if sizes["before_pruning"] is None else [
        f"Synthetic observations are sized so that {report['settings']['turns']} turns fit a "
        f"{context}-token history (--context-tokens, at most the model's context): "
        f"{sizes['before_pruning']:.0f} tokens on average before pruning, "
        f"{sizes['after_pruning']:.0f} after; replies are {REPLY_TOKENS[0]} to {REPLY_TOKENS[1]} tokens."]
    return [*NOTES, *observations]


def totals_chart(report: dict[str, Any]) -> BarChart:
    synthetic = report["synthetic"]
    title = f"Prefill tokens, {synthetic['sessions']} synthetic sessions\nturn-delta reuse: " \
            f"{synthetic['reduction']:.1f}x full recompute, {synthetic['reduction_over_prefix_caching']:.2f}x " \
            f"prefix caching only"
    return BarChart(TOTALS_CHART, title, "prefill tokens",
                    ["full recompute", "measured, no cache", "prefix caching, no pin", "turn-delta reuse"],
                    [synthetic["prefill_tokens_full_recompute"], synthetic["prefill_tokens_measured_no_cache"],
                     synthetic["prefill_tokens_prefix_caching"], synthetic["prefill_tokens_turn_delta"]])


def save_per_turn_chart(figures: Figures, path: Path) -> None:
    full, delta = figures.per_turn()
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    turns = range(1, len(full) + 1)
    axes.plot(turns, full, marker="o", label="full recompute (whole prompt)")
    axes.plot(turns, figures.replays[CACHE_ON], marker="o", label="prefix caching, no session pin")
    axes.plot(turns, delta, marker="o", label="turn-delta reuse (session pin)")
    axes.set_title(f"Prefill tokens per turn, summed over {len(figures.sessions)} sessions")
    axes.set_xlabel("turn")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("prefill tokens")
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.savefig(path, dpi=120)
