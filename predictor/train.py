"""Training: seeded split by session, L1 loss on log1p targets, then held-out errors against both baselines.

L1 on log1p values fits the conditional median, which is also what minimises the mean absolute error in tokens
(the logarithm is monotone, so medians carry over).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress

from predictor.evaluate import better_predictor, evaluate_traces, file_digest, split_sessions
from predictor.features import WINDOW_TURNS, Example, examples, turn_targets, typical_gap_s
from predictor.model import ModelConfig, NextTurnLSTM, encode, save_model
from predictor.records import PredictorInputError
from predictor.traces import load_sessions, portable_path

METADATA_FORMAT = 1


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 30
    hidden: int = 48
    window: int = WINDOW_TURNS
    learning_rate: float = 3e-3
    batch_size: int = 64
    seed: int = 0
    heldout_share: float = 0.2
    threads: int = 1

    def validate(self) -> None:
        for name in ("epochs", "hidden", "window", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise PredictorInputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise PredictorInputError(f"--learning-rate must be positive, got {self.learning_rate}")
        if not 0 < self.heldout_share < 1:
            raise PredictorInputError(f"--heldout-share must be between 0 and 1, got {self.heldout_share}")


def train(traces: Sequence[Path], out: Path, settings: TrainSettings, show_progress: bool = True) -> dict[str, Any]:
    """Train on the traces' training sessions, save the model and its metadata to `out`; return the metadata."""
    settings.validate()
    torch.set_num_threads(settings.threads)
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    training, heldout = split_sessions(load_sessions(traces), settings.heldout_share, settings.seed)
    fallback_gap_s = typical_gap_s(training.values())
    found = examples(training.values(), settings.window, fallback_gap_s)
    if not found:
        raise PredictorInputError("no training session has two turns: nothing to learn")
    model = NextTurnLSTM(ModelConfig(hidden=settings.hidden, window=settings.window))
    fit(model, found, settings, show_progress)
    try:
        reports = evaluate_traces(model, heldout, traces, fallback_gap_s)
    except PredictorInputError:
        raise PredictorInputError("no held-out session has two turns: give more sessions") from None
    metadata = {
        "format": METADATA_FORMAT,
        "training": {"traces": [portable_path(path) for path in traces],
                     "sha256": [file_digest(path) for path in traces], "seed": settings.seed,
                     "heldout_share": settings.heldout_share, "settings": asdict(settings),
                     "sessions": len(training), "turns": len(found)},
        "fallback_gap_s": fallback_gap_s,
        "heldout": reports.as_json(),
        "forecaster_uses": better_predictor(reports.overall.prefill_tokens),
    }
    save_model(out, model, metadata)
    return metadata


def fit(model: NextTurnLSTM, found: Sequence[Example], settings: TrainSettings, show_progress: bool) -> None:
    features, lengths = encode([example.history for example in found], settings.window)
    targets = torch.tensor([turn_targets(example.target) for example in found])
    valid = torch.arange(settings.window) < lengths[:, None]
    model.set_scales(features[valid], targets)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    generator = torch.Generator().manual_seed(settings.seed)
    batches = -(-len(found) // settings.batch_size)
    model.train()
    with Progress(console=Console(stderr=True), disable=not show_progress) as progress:
        task = progress.add_task("training", total=settings.epochs * batches)
        for epoch in range(settings.epochs):
            order = torch.randperm(len(found), generator=generator)
            total = 0.0
            for batch in order.split(settings.batch_size):
                predicted = model(features[batch], lengths[batch])
                loss = ((predicted - targets[batch]).abs() / model.target_std).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(batch)
                progress.advance(task)
            progress.update(task, description=f"epoch {epoch + 1}/{settings.epochs} loss {total / len(found):.3f}")
    model.eval()
