"""A model's own sampling defaults, applied to what a request leaves unset (vLLM applies a checkpoint's
`generation_config.json` the same way). A built-in model's come from the `sampling` section of its
`configs/models/<name>.yaml`, a checkpoint directory's from its `generation_config.json`; a model with
neither samples as OpenAI's API does (temperature 1, top_p 1, no top-k, no min-p). A parameter the request
sets is used as set."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from engine.config import MODELS_DIR

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> SamplingDefaults:
        """The known keys of `values`; a top_k of 0 or less means none (generation_config.json's convention)."""
        known = {key: values[key] for key in SAMPLING_KEYS if values.get(key) is not None}
        if known.get("top_k") is not None and known["top_k"] <= 0:
            known.pop("top_k")
        return cls(**known)

    def resolve(self, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                min_p: float | None = None) -> dict[str, Any]:
        """The sampling a request gets: each parameter it sets (not None), else this default."""
        asked = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
        return {f.name: getattr(self, f.name) if asked[f.name] is None else asked[f.name] for f in fields(self)}


def model_sampling_defaults(model: str, checkpoint: Path | None = None) -> SamplingDefaults:
    """The defaults of a built-in model name, else of the checkpoint directory's `generation_config.json`."""
    builtin = MODELS_DIR / f"{model}.yaml"
    if builtin.is_file():
        data = yaml.safe_load(builtin.read_text()) or {}
        return SamplingDefaults.from_mapping(data.get("sampling") or {})
    directory = checkpoint if checkpoint is not None and checkpoint.is_dir() else Path(model)
    generation_config = directory / "generation_config.json"
    if not generation_config.is_file():
        return SamplingDefaults()
    return SamplingDefaults.from_mapping(json.loads(generation_config.read_text()))  # do_sample ignored, as vLLM does
