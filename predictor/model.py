"""The next-turn LSTM, its batched inference, and its file format.

A model file is `torch.save` of `{"config": {...}, "state_dict": {...}}` (loads with `weights_only=True`); its
metadata (training data, held-out errors, which predictor the forecaster uses) sits beside it as `<name>.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from predictor.features import FEATURES, TARGETS, turn_features
from predictor.records import NextTurn, PredictorInputError, TurnRecord

DEFAULT_MODEL = Path(__file__).resolve().parent / "default_model.pt"


class ModelFileError(PredictorInputError):
    """A model file or its metadata that is missing or unreadable."""


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 48
    window: int = 8


class NextTurnLSTM(nn.Module):
    """log1p features of a session's last turns -> log1p of the next turn's new tokens, output tokens, gap.

    Inputs and targets are standardized inside, with statistics of the training set kept as buffers.
    """

    feature_mean: torch.Tensor
    feature_std: torch.Tensor
    target_mean: torch.Tensor
    target_std: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.lstm = nn.LSTM(len(FEATURES), config.hidden, batch_first=True)
        self.head = nn.Linear(config.hidden, len(TARGETS))
        for name, size in (("feature", len(FEATURES)), ("target", len(TARGETS))):
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))

    def set_scales(self, features: torch.Tensor, targets: torch.Tensor) -> None:
        """Standardize with these (rows of) training features and targets."""
        for name, rows in (("feature", features), ("target", targets)):
            getattr(self, f"{name}_mean").copy_(rows.mean(0))
            getattr(self, f"{name}_std").copy_(rows.std(0).clamp_min(1e-3))

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """`features`: (batch, window, features), left-aligned, padded; returns (batch, targets) in log1p."""
        scaled = (features - self.feature_mean) / self.feature_std
        packed = pack_padded_sequence(scaled, lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.head(hidden[-1]) * self.target_std + self.target_mean


def encode(histories: Sequence[Sequence[TurnRecord]], window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded features of each history's last `window` turns, and the lengths."""
    batch = torch.zeros(len(histories), window, len(FEATURES))
    lengths = torch.zeros(len(histories), dtype=torch.long)
    for row, history in enumerate(histories):
        recent = history[-window:]
        if recent:
            batch[row, : len(recent)] = torch.tensor([turn_features(turn) for turn in recent])
        lengths[row] = len(recent)
    return batch, lengths


@torch.inference_mode()
def predict(model: NextTurnLSTM, histories: Sequence[Sequence[TurnRecord]]) -> list[NextTurn]:
    """The next turn of each history (each at least one turn long), in one batched pass."""
    if not histories:
        return []
    model.eval()
    features, lengths = encode(histories, model.config.window)
    values = torch.expm1(model(features, lengths)).clamp_min(0.0)
    return [NextTurn(*row) for row in values.tolist()]


def metadata_path(model_path: Path) -> Path:
    return model_path.with_suffix(".json")


def save_model(path: Path, model: NextTurnLSTM, metadata: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": asdict(model.config), "state_dict": model.state_dict()}, path)
    metadata_path(path).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")


def load_model(path: Path) -> tuple[NextTurnLSTM, dict[str, Any]]:
    """The model and its metadata."""
    if not path.is_file():
        raise ModelFileError(f"model not found: {path}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model = NextTurnLSTM(ModelConfig(**saved["config"]))
        model.load_state_dict(saved["state_dict"])
    except Exception as error:  # a corrupt or foreign file fails in torch.load or load_state_dict, many ways
        raise ModelFileError(f"{path}: not a predictor model ({type(error).__name__})") from None
    return model, load_metadata(path)


def load_metadata(model_path: Path) -> dict[str, Any]:
    path = metadata_path(model_path)
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ModelFileError(f"model metadata missing or not JSON: {path}") from None
    if not isinstance(metadata, dict):
        raise ModelFileError(f"model metadata is not a JSON object: {path}")
    return metadata
