"""`agentserve predictor train|eval`. Numbers are parsed here, not by argparse, so a bad one is a one-line error."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from predictor.evaluate import EvalReport, evaluate, heldout_sessions
from predictor.model import DEFAULT_MODEL, load_model
from predictor.records import PredictorInputError
from predictor.traces import DEFAULT_TRACE, load_sessions
from predictor.train import TrainSettings, train

NUMBER_OPTIONS: dict[str, Callable[[str], Any]] = {field.name: type(getattr(TrainSettings(), field.name))
                                                   for field in fields(TrainSettings)}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predictor", help="next-turn load forecasting: train and evaluate the LSTM")
    actions = p.add_subparsers(dest="action", required=True)
    _add_train(actions)
    _add_eval(actions)


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
    p.add_argument("--json", action="store_true", help='print {"mae": {...}, "n_turns": n, "details": {...}}')
    p.set_defaults(run=_run_eval)


def _number(name: str, text: str) -> Any:
    kind = NUMBER_OPTIONS[name]
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
    sessions = load_sessions(args.trace) if args.trace else heldout_sessions(metadata)
    report = evaluate(model, list(sessions.values()), float(metadata.get("fallback_gap_s", 0.0)))
    print(json.dumps(report.as_json()) if args.json else _table(report, "whole traces" if args.trace else
                                                                   "held-out sessions"))


def _table(report: EvalReport, data: str) -> str:
    rows = [f"next-turn mean absolute error on {data}, {report.n_turns} turns",
            f"{'':<22}{'predictor':>12}{'last value':>12}{'EMA':>12}"]
    for label, errors in (("prefill tokens", report.prefill_tokens), ("decode tokens", report.decode_tokens),
                          ("arrival gap (s)", report.arrival_gap_s),
                          (f"prefill, turn 3+ ({report.n_turns_from_third_turn})",
                           report.prefill_tokens_from_third_turn)):
        rows.append(f"{label:<22}{errors.predictor:>12.1f}{errors.last_value:>12.1f}{errors.ema:>12.1f}")
    return "\n".join(rows)
