"""Mean absolute error of the LSTM and of both baselines on next turns, and the seeded split by session."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from predictor.features import Example, examples, mean_absolute_error
from predictor.model import ModelFileError, NextTurnLSTM, predict
from predictor.records import NextTurn, PredictorInputError, TurnRecord
from predictor.traces import Sessions, file_of, file_sessions, load_sessions, portable_path, resolve_path

Choice = Literal["lstm", "last_value", "ema"]
TURN_INDEX_CAP = 10  # errors by turn index: turns 2 to 9 each, then turn 10 and every later one together


@dataclass(frozen=True)
class Errors:
    """Mean absolute error of each predictor for one quantity."""

    predictor: float
    last_value: float
    ema: float


@dataclass(frozen=True)
class TurnIndexErrors:
    """The errors on next turns at one place in their sessions: `turn` "2" (second turns), "3", ..., and the
    last bucket `"<TURN_INDEX_CAP>+"` for that turn and every later one."""

    turn: str
    n_turns: int
    prefill_tokens: Errors
    decode_tokens: Errors
    arrival_gap_s: Errors

    def as_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "n_turns": self.n_turns, "prefill_tokens_mae": asdict(self.prefill_tokens),
                "decode_tokens_mae": asdict(self.decode_tokens), "arrival_gap_s_mae": asdict(self.arrival_gap_s)}


@dataclass(frozen=True)
class EvalReport:
    prefill_tokens: Errors  # the headline: next-turn new input tokens
    decode_tokens: Errors
    arrival_gap_s: Errors
    n_turns: int
    prefill_tokens_from_third_turn: Errors  # without second turns, whose baselines repeat the whole first prompt
    n_turns_from_third_turn: int
    by_turn_index: tuple[TurnIndexErrors, ...]  # in turn order, buckets without a target left out

    def as_json(self) -> dict[str, Any]:
        return {"mae": asdict(self.prefill_tokens), "n_turns": self.n_turns,
                "details": {"decode_tokens_mae": asdict(self.decode_tokens),
                            "arrival_gap_s_mae": asdict(self.arrival_gap_s),
                            "from_third_turn": {"mae": asdict(self.prefill_tokens_from_third_turn),
                                                "n_turns": self.n_turns_from_third_turn},
                            "by_turn_index": [bucket.as_json() for bucket in self.by_turn_index]}}


@dataclass(frozen=True)
class TraceReports:
    """The errors over all sessions, and over each file's own (files without a next turn left out)."""

    overall: EvalReport
    per_trace: dict[str, EvalReport]  # keyed by the file's name as `portable_path` writes it

    def as_json(self) -> dict[str, Any]:
        return {**self.overall.as_json(), "per_trace": {name: r.as_json() for name, r in self.per_trace.items()}}


def split_sessions(sessions: Sessions, heldout_share: float, seed: int) -> tuple[Sessions, Sessions]:
    """(training, held-out): a seeded shuffle of the session keys; of each file's, the first `heldout_share` are
    held out, so every file has its share of held-out sessions."""
    if not 0 < heldout_share < 1:
        raise PredictorInputError(f"the held-out share must be between 0 and 1, got {heldout_share}")
    keys = sorted(sessions)
    random.Random(seed).shuffle(keys)
    by_file: dict[str, list[str]] = {}
    for key in keys:
        by_file.setdefault(file_of(key), []).append(key)
    heldout = {key for own in by_file.values() for key in own[:round(len(own) * heldout_share)]}
    return ({k: sessions[k] for k in keys if k not in heldout}, {k: sessions[k] for k in keys if k in heldout})


Scored = Sequence[tuple[Example, NextTurn]]  # each example with the model's prediction of it


def evaluate(model: NextTurnLSTM, sessions: Sequence[Sequence[TurnRecord]], fallback_gap_s: float) -> EvalReport:
    found = examples(sessions, model.config.window, fallback_gap_s)
    if not found:
        raise PredictorInputError("no session has two turns: nothing to evaluate")
    scored = list(zip(found, predict(model, [example.history for example in found]), strict=True))
    later = [pair for pair in scored if pair[0].turn_index >= 3]
    return EvalReport(*_quantities(scored), n_turns=len(scored),
                      prefill_tokens_from_third_turn=_errors(later, "new_tokens"), n_turns_from_third_turn=len(later),
                      by_turn_index=_by_turn_index(scored))


def evaluate_traces(model: NextTurnLSTM, sessions: Sessions, traces: Sequence[Path],
                    fallback_gap_s: float) -> TraceReports:
    """`sessions` as `load_sessions(traces)` keys them (or a subset): all together, then each file's."""
    per_trace = {}
    for index, path in enumerate(traces):
        own = file_sessions(sessions, index)
        if any(len(turns) > 1 for turns in own):
            per_trace[portable_path(path)] = evaluate(model, own, fallback_gap_s)
    return TraceReports(evaluate(model, list(sessions.values()), fallback_gap_s), per_trace)


def _by_turn_index(scored: Scored) -> tuple[TurnIndexErrors, ...]:
    buckets: dict[int, list[tuple[Example, NextTurn]]] = {}
    for pair in scored:
        buckets.setdefault(min(pair[0].turn_index, TURN_INDEX_CAP), []).append(pair)
    return tuple(TurnIndexErrors(f"{index}+" if index == TURN_INDEX_CAP else str(index), len(bucket),
                                 *_quantities(bucket)) for index, bucket in sorted(buckets.items()))


def _quantities(scored: Scored) -> tuple[Errors, Errors, Errors]:
    """The errors in prefill tokens, decode tokens and arrival gap."""
    return _errors(scored, "new_tokens"), _errors(scored, "output_tokens"), _errors(scored, "gap_s")


def _errors(scored: Scored, field: str) -> Errors:
    target_field = "tool_gap_s" if field == "gap_s" else field
    actual = [float(getattr(example.target, target_field)) for example, _ in scored]
    return Errors(predictor=mean_absolute_error([getattr(p, field) for _, p in scored], actual),
                  last_value=mean_absolute_error([getattr(e.last_value, field) for e, _ in scored], actual),
                  ema=mean_absolute_error([getattr(e.ema, field) for e, _ in scored], actual))


def better_predictor(prefill: Errors) -> Choice:
    """The LSTM when it beat both baselines on prefill tokens, else the better baseline."""
    if prefill.predictor < min(prefill.last_value, prefill.ema):
        return "lstm"
    return "last_value" if prefill.last_value <= prefill.ema else "ema"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def heldout_sessions(metadata: dict[str, Any]) -> tuple[list[Path], Sessions]:
    """The model's training files and their held-out sessions; the files must be unchanged since training."""
    try:
        data = metadata["training"]
        traces = [resolve_path(p) for p in data["traces"]]
        digests, share, seed = data["sha256"], data["heldout_share"], data["seed"]
    except (KeyError, TypeError):
        raise ModelFileError("model metadata has no training section; pass --trace FILE") from None
    for path, digest in zip(traces, digests, strict=True):
        if not path.is_file():
            raise PredictorInputError(f"the model's training trace is not here: {path} (pass --trace FILE)")
        if file_digest(path) != digest:
            raise PredictorInputError(f"the model's training trace changed since training: {path}")
    return traces, split_sessions(load_sessions(traces), share, seed)[1]
