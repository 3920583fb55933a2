"""`agentserve predictor train|eval|replay`. Numbers are parsed here, not by argparse: a bad one is one line."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from predictor.evaluate import Errors, EvalReport, TraceReports, evaluate_traces, heldout_sessions
from predictor.forecast import LoadForecaster
from predictor.model import DEFAULT_MODEL, load_model
from predictor.recording import read_timed_turns
from predictor.records import PredictorInputError
from predictor.replay import replay
from predictor.traces import DEFAULT_TRACE, load_sessions
from predictor.train import TrainSettings, train

NUMBER_OPTIONS: dict[str, Callable[[str], Any]] = {field.name: type(getattr(TrainSettings(), field.name))
                                                   for field in fields(TrainSettings)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predictor", help="next-turn load forecasting: train and evaluate the LSTM, "
                       "replay the forecast")
    actions = p.add_subparsers(dest="action", required=True)
    _add_train(actions)
    _add_eval(actions)
    _add_replay(actions)


def _add_train(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("train", help="train on Mooncake traces and/or gateway recordings (kind read from content)")
    p.add_argument("--trace", nargs="+", type=Path, default=[DEFAULT_TRACE], metavar="FILE",
                   help=f"trace or recording files (default {DEFAULT_TRACE})")
    p.add_argument("--out", type=Path, required=True, help="model file to write; metadata goes beside it as .json")
    defaults = TrainSettings()
    for name in NUMBER_OPTIONS:
        p.add_argument(f"--{name.replace('_', '-')}", default=str(getattr(defaults, name)), metavar="N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _add_eval(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("eval", help="mean absolute error of next-turn prefill tokens against two baselines")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help=f"model file (default {DEFAULT_MODEL})")
    p.add_argument("--trace", nargs="+", type=Path, metavar="FILE",
                   help="evaluate on these whole files (default: the model's own held-out sessions)")
    p.add_argument("--json", action="store_true",
                   help='print {"mae": {...}, "n_turns": n, "details": {...}, "per_trace": {FILE: {...}}}')
    p.set_defaults(run=_run_eval)


def _add_replay(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("replay", help="the forecast the capacity controller reads, against the load that came, "
                           "on a gateway recording")
    p.add_argument("--recording", type=Path, required=True, metavar="FILE", help="a gateway recording (JSONL)")
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help=f"model file (default {DEFAULT_MODEL})")
    p.add_argument("--horizon", default="1.0", metavar="S", help="forecast horizon, seconds (the controller's: 1)")
    p.add_argument("--overdue", default=str(LoadForecaster.DEFAULT_OVERDUE_S), metavar="S",
                   help="seconds a late turn stays expected (the forecaster's default)")
    p.add_argument("--step", default="0.1", metavar="S", help="seconds between forecasts (the controller's: 0.1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_run_replay)


def _number(name: str, text: str, kind: Callable[[str], Any] | None = None) -> Any:
    kind = kind or NUMBER_OPTIONS[name]
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise PredictorInputError(f"--{name.replace('_', '-')} must be a{'n integer' if kind is int else ' number'}, "
                                  f"got {text!r}")
    return value


def _run_train(args: argparse.Namespace) -> None:
    settings = TrainSettings(**{name: _number(name, getattr(args, name)) for name in NUMBER_OPTIONS})
    metadata = train(args.trace, args.out, settings, show_progress=not args.quiet)
    mae, n_turns = metadata["heldout"]["mae"], metadata["heldout"]["n_turns"]
    print(f"wrote {args.out}: held-out MAE of next-turn prefill tokens over {n_turns} turns: predictor "
          f"{mae['predictor']:.1f}, last value {mae['last_value']:.1f}, EMA {mae['ema']:.1f}; "
          f"the forecaster uses {metadata['forecaster_uses']}")


def _run_eval(args: argparse.Namespace) -> None:
    model, metadata = load_model(args.model)
    if args.trace:
        traces, sessions, data = list(args.trace), load_sessions(args.trace), "whole files"
    else:
        (traces, sessions), data = heldout_sessions(metadata), "held-out sessions"
    reports = evaluate_traces(model, sessions, traces, float(metadata.get("fallback_gap_s", 0.0)))
    print(json.dumps(reports.as_json()) if args.json else _tables(reports, data))


def _run_replay(args: argparse.Namespace) -> None:
    horizon, overdue, step = (_number(name, getattr(args, name), float) for name in ("horizon", "overdue", "step"))
    if horizon < 0 or overdue < 0:
        raise PredictorInputError("--horizon and --overdue must be at least 0 seconds")
    if not args.recording.is_file():
        raise PredictorInputError(f"recording not found: {args.recording}")
    report = replay(LoadForecaster(args.model, overdue_s=overdue), read_timed_turns(args.recording), horizon, step)
    if args.json:
        print(json.dumps(report.as_json()))
        return
    print(f"{report.forecasts} forecasts of the next {horizon:g} s, every {step:g} s (late turns expected for "
          f"{overdue:g} s), per forecast:")
    for label, errors in (("prefill tokens", report.prefill_tokens), ("decode tokens", report.decode_tokens)):
        print(f"{label:<16} forecast {errors.forecast:>9.1f}  arrived {errors.arrived:>9.1f}  "
              f"mean absolute error {errors.mae:>9.1f}")


def _tables(reports: TraceReports, data: str) -> str:
    """All files together, then each file on its own when there are several."""
    tables = [_table(reports.overall, f"{data} of all files")]
    if len(reports.per_trace) > 1:
        tables += [_table(report, f"{data} of {name}") for name, report in reports.per_trace.items()]
    return "\n\n".join(tables)


def _table(report: EvalReport, data: str) -> str:
    rows = [f"next-turn mean absolute error, {data}: {report.n_turns} turns",
            f"{'':<22}{'predictor':>12}{'last value':>12}{'EMA':>12}"]
    for label, errors in (("prefill tokens", report.prefill_tokens), ("decode tokens", report.decode_tokens),
                          ("arrival gap (s)", report.arrival_gap_s),
                          (f"prefill, turn 3+ ({report.n_turns_from_third_turn})",
                           report.prefill_tokens_from_third_turn)):
        rows.append(f"{label:<22}{_columns(errors, 12)}")
    rows += ["by turn index (predictor / last value / EMA):",
             f"{'turn':>6}{'n':>7}{'prefill tokens':>33}{'decode tokens':>33}{'arrival gap (s)':>33}"]
    rows += [f"{bucket.turn:>6}{bucket.n_turns:>7}{_columns(bucket.prefill_tokens, 11)}"
             f"{_columns(bucket.decode_tokens, 11)}{_columns(bucket.arrival_gap_s, 11)}"
             for bucket in report.by_turn_index]
    return "\n".join(rows)


def _columns(errors: Errors, width: int) -> str:
    return "".join(f"{value:>{width}.1f}" for value in (errors.predictor, errors.last_value, errors.ema))
