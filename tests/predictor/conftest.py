"""Small seeded traces in both file formats, and one model trained on them once per test run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from predictor.train import TrainSettings, train

BLOCK = 512


def synthetic_mooncake_rows(sessions: int, seed: int) -> list[dict[str, object]]:
    """Sessions whose prompts grow by whole blocks, last block partial and renamed each turn, as in Mooncake."""
    rng = random.Random(seed)
    next_id = 1
    rows = []
    for _ in range(sessions):
        full, t = [0, next_id], rng.randrange(0, 60_000)
        next_id += 1
        for _ in range(rng.randrange(1, 7)):
            partial = next_id
            next_id += 1
            rows.append({"timestamp": t, "input_length": len(full) * BLOCK + rng.randrange(1, BLOCK),
                         "output_length": rng.randrange(5, 400), "hash_ids": [*full, partial]})
            grown = rng.randrange(1, 4)
            full += list(range(next_id, next_id + grown))
            next_id += grown
            t += rng.randrange(500, 20_000)
    return sorted(rows, key=lambda row: int(str(row["timestamp"])))


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("trace") / "trace.jsonl", synthetic_mooncake_rows(80, seed=7))


@pytest.fixture(scope="session")
def small_model(small_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "model.pt"
    train([small_trace], out, TrainSettings(epochs=3, hidden=16, seed=1), show_progress=False)
    return out
