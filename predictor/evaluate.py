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
from predictor.traces import Sessions, load_sessions

Choice = Literal["lstm", "last_value", "ema"]


@dataclass(frozen=True)
class Errors:
    """Mean absolute error of each predictor for one quantity."""

    predictor: float
    last_value: float
    ema: float


@dataclass(frozen=True)
class EvalReport:
    prefill_tokens: Errors  # the headline: next-turn new input tokens
    decode_tokens: Errors
    arrival_gap_s: Errors
    n_turns: int
    prefill_tokens_from_third_turn: Errors  # without second turns, whose baselines repeat the whole first prompt
    n_turns_from_third_turn: int

    def as_json(self) -> dict[str, Any]:
        return {"mae": asdict(self.prefill_tokens), "n_turns": self.n_turns,
                "details": {"decode_tokens_mae": asdict(self.decode_tokens),
                            "arrival_gap_s_mae": asdict(self.arrival_gap_s),
                            "from_third_turn": {"mae": asdict(self.prefill_tokens_from_third_turn),
                                                "n_turns": self.n_turns_from_third_turn}}}


def split_sessions(sessions: Sessions, heldout_share: float, seed: int) -> tuple[Sessions, Sessions]:
    """(training, held-out): a seeded shuffle of the session keys, the first `heldout_share` of them held out."""
    if not 0 < heldout_share < 1:
        raise PredictorInputError(f"the held-out share must be between 0 and 1, got {heldout_share}")
    keys = sorted(sessions)
    random.Random(seed).shuffle(keys)
    cut = round(len(keys) * heldout_share)
    return {k: sessions[k] for k in keys[cut:]}, {k: sessions[k] for k in keys[:cut]}


def evaluate(model: NextTurnLSTM, sessions: Sequence[Sequence[TurnRecord]], fallback_gap_s: float) -> EvalReport:
    found = examples(sessions, model.config.window, fallback_gap_s)
    if not found:
        raise PredictorInputError("no session has two turns: nothing to evaluate")
    predicted = predict(model, [example.history for example in found])
    later = [index for index, example in enumerate(found) if len(example.history) > 1]
    return EvalReport(prefill_tokens=_errors(found, predicted, "new_tokens"),
                      decode_tokens=_errors(found, predicted, "output_tokens"),
                      arrival_gap_s=_errors(found, predicted, "gap_s"), n_turns=len(found),
                      prefill_tokens_from_third_turn=_errors([found[i] for i in later], [predicted[i] for i in later],
                                                             "new_tokens"),
                      n_turns_from_third_turn=len(later))


def _errors(found: Sequence[Example], predicted: Sequence[NextTurn], field: str) -> Errors:
    target_field = "tool_gap_s" if field == "gap_s" else field
    actual = [float(getattr(example.target, target_field)) for example in found]
    return Errors(predictor=mean_absolute_error([getattr(p, field) for p in predicted], actual),
                  last_value=mean_absolute_error([getattr(e.last_value, field) for e in found], actual),
                  ema=mean_absolute_error([getattr(e.ema, field) for e in found], actual))


def better_predictor(prefill: Errors) -> Choice:
    """The LSTM when it beat both baselines on prefill tokens, else the better baseline."""
    if prefill.predictor < min(prefill.last_value, prefill.ema):
        return "lstm"
    return "last_value" if prefill.last_value <= prefill.ema else "ema"


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def heldout_sessions(metadata: dict[str, Any]) -> Sessions:
    """The held-out sessions of the model's own training data, which must be unchanged since training."""
    try:
        data = metadata["training"]
        traces = [Path(p) for p in data["traces"]]
        digests, share, seed = data["sha256"], data["heldout_share"], data["seed"]
    except (KeyError, TypeError):
        raise ModelFileError("model metadata has no training section; pass --trace FILE") from None
    for path, digest in zip(traces, digests, strict=True):
        if not path.is_file():
            raise PredictorInputError(f"the model's training trace is not here: {path} (pass --trace FILE)")
        if file_digest(path) != digest:
            raise PredictorInputError(f"the model's training trace changed since training: {path}")
    return split_sessions(load_sessions(traces), share, seed)[1]
