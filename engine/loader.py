"""Build a model: a built-in YAML config with seeded random weights, or a local Hugging Face checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.config import MODELS_DIR, ModelConfig
from engine.model import LlamaForCausalLM

INDEX_FILE = "model.safetensors.index.json"
DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)


class ModelLoadError(ValueError):
    """The model cannot be built; the message is one line naming the problem."""


@dataclass
class LoadedModel:
    config: ModelConfig
    model: LlamaForCausalLM
    checkpoint_dir: Path | None


def builtin_model_names() -> list[str]:
    return sorted(path.stem for path in MODELS_DIR.glob("*.yaml"))


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> LoadedModel:
    names = builtin_model_names()
    if name_or_path in names:
        config = ModelConfig.from_yaml(MODELS_DIR / f"{name_or_path}.yaml")
        model = _assemble(config, random_weights(config), dtype, device)
        return LoadedModel(config, model, None)
    directory = Path(name_or_path)
    if not directory.is_dir():
        raise ModelLoadError(f"unknown model {name_or_path!r}: not a built-in model ({', '.join(names)}) "
                             "and not a checkpoint directory")
    config = read_hf_config(directory)
    model = _assemble(config, read_safetensors(directory), dtype, device)
    return LoadedModel(config, model, directory)


def read_hf_config(directory: Path) -> ModelConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"no config.json in {directory}")
    try:
        return ModelConfig.from_hf_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
    except KeyError as err:
        raise ModelLoadError(f"{path} lacks {err}") from err
    except ValueError as err:
        raise ModelLoadError(f"{path}: {err}") from err


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / shard for shard in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors in {directory}")
    return files


def read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for path in safetensors_files(directory):
        try:
            weights.update(load_file(path))
        except (OSError, SafetensorError) as err:
            raise ModelLoadError(f"cannot read {path}: {_first_line(err)}") from err
    return {name: t for name, t in weights.items() if not name.endswith(DROPPED_SUFFIXES)}


def random_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) matrices, unit norms, zero biases, from a generator seeded with `config.seed`."""
    generator = torch.Generator().manual_seed(config.seed)
    weights = {}
    for name, param in _skeleton(config).named_parameters():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(param.shape)
        elif name.endswith(".bias"):
            weights[name] = torch.zeros(param.shape)
        else:
            weights[name] = torch.empty(param.shape).normal_(0.0, 0.02, generator=generator)
    return weights


def _skeleton(config: ModelConfig) -> LlamaForCausalLM:
    """The model with parameters on the meta device (no memory, no init)."""
    try:
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    except (KeyError, ValueError) as err:
        raise ModelLoadError(f"unsupported model config: {err}") from err


def _assemble(config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype,
              device: torch.device | str) -> LlamaForCausalLM:
    model = _skeleton(config)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    _check_names_and_shapes(model, weights)
    state = {name: t.to(device=device, dtype=dtype) for name, t in weights.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _check_names_and_shapes(model: LlamaForCausalLM, weights: dict[str, torch.Tensor]) -> None:
    expected = dict(model.state_dict())
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    if missing:
        raise ModelLoadError(f"checkpoint lacks {len(missing)} tensors, e.g. {_few(missing)}")
    if unexpected:
        raise ModelLoadError(f"checkpoint has {len(unexpected)} unexpected tensors, e.g. {_few(unexpected)}")
    for name, param in expected.items():
        if weights[name].shape != param.shape:
            raise ModelLoadError(f"tensor {name} has shape {tuple(weights[name].shape)}, "
                                 f"expected {tuple(param.shape)}")


def _few(names: Iterable[str], limit: int = 3) -> str:
    return ", ".join(list(names)[:limit])


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
