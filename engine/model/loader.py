"""Build a model: a built-in YAML config with seeded random weights, a built-in or local GGUF file, or a local
Hugging Face checkpoint directory."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.config import MODELS_DIR, ModelConfig
from engine.model.gguf import GGUF_SUFFIX, is_gguf_path
from engine.model.gguf.package import PackagedGGUF, PackagedModelError
from engine.model.gguf.quantized import keeps_quantized, quantized_linear
from engine.model.gguf.reader import GGUFError, GGUFModel, read_config, read_gguf
from engine.model.gguf.tokenizer import load_gguf_tokenizer
from engine.model.llama import LlamaForCausalLM
from engine.model.tokenizer import (
    BUILTIN_MODEL,
    HF_TOKENIZER_FILE,
    SP_TOKENIZER_FILE,
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    TokenizerNotFoundError,
)

INDEX_FILE = "model.safetensors.index.json"
DROPPED_SUFFIXES = ("rotary_emb.inv_freq",)
GGUFWeights = Literal["auto", "dequantize", "quantized"]


class ModelLoadError(ValueError):
    """The model cannot be built; the message is one line naming the problem."""


@dataclass
class LoadedModel:
    config: ModelConfig
    model: LlamaForCausalLM
    checkpoint: Path | None  # a checkpoint directory or a GGUF file; None: random weights


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, known without its weights."""

    config: ModelConfig
    checkpoint: Path | None

    @property
    def is_gguf(self) -> bool:
        return self.checkpoint is not None and self.checkpoint.suffix == GGUF_SUFFIX


def builtin_model_names() -> list[str]:
    return sorted(path.stem for path in MODELS_DIR.glob("*.yaml"))


def builtin_gguf(name: str) -> Path:
    """The GGUF file of a built-in model that names one (checked against its sha256)."""
    spec = _builtin_yaml(name).get("gguf")
    if spec is None:
        raise ModelLoadError(f"built-in model {name!r} has no GGUF file")
    try:
        return PackagedGGUF.from_dict(spec).locate()
    except PackagedModelError as err:
        raise ModelLoadError(f"built-in model {name!r}: {err}") from err


def resolve_model(name_or_path: str) -> ModelSource:
    """A built-in model's or a checkpoint's config and file, without loading weights."""
    names = builtin_model_names()
    if name_or_path in names:
        if "gguf" in _builtin_yaml(name_or_path):
            return _gguf_source(builtin_gguf(name_or_path))
        return ModelSource(ModelConfig.from_yaml(MODELS_DIR / f"{name_or_path}.yaml"), None)
    path = Path(name_or_path)
    if path.is_file() and path.suffix == GGUF_SUFFIX:
        return _gguf_source(path)
    if not path.is_dir():
        raise ModelLoadError(f"unknown model {name_or_path!r}: not a built-in model ({', '.join(names)}), "
                             "a GGUF file or a checkpoint directory")
    return ModelSource(read_hf_config(path), path)


def load_tokenizer(model_dir: Path | None) -> Tokenizer:
    """The checkpoint directory's tokenizer (tokenizer.json before tokenizer.model), a GGUF file's (read from its
    metadata), or the built-in one for None. A bad GGUF file raises `GGUFTokenizerError`, a ValueError."""
    if model_dir is None:
        return SentencePieceTokenizer.from_file(BUILTIN_MODEL)
    model_dir = Path(model_dir)
    if is_gguf_path(model_dir):
        return load_gguf_tokenizer(model_dir)
    if (model_dir / HF_TOKENIZER_FILE).is_file():
        return HFTokenizer.from_dir(model_dir)
    if (model_dir / SP_TOKENIZER_FILE).is_file():
        return SentencePieceTokenizer.from_file(model_dir / SP_TOKENIZER_FILE, model_dir)
    raise TokenizerNotFoundError(
        f"no {HF_TOKENIZER_FILE} or {SP_TOKENIZER_FILE} in checkpoint directory {model_dir}")


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               gguf_weights: GGUFWeights = "dequantize") -> LoadedModel:
    """`gguf_weights="quantized"` keeps a GGUF file's quantized matrices quantized (CPU kernels); "auto" does on
    the CPU and dequantizes on other devices (no kernels there)."""
    source = resolve_model(name_or_path)
    config, checkpoint = source.config, source.checkpoint
    if checkpoint is None:
        return LoadedModel(config, _assemble(config, random_weights(config), dtype, device), None)
    if not source.is_gguf:
        return LoadedModel(config, _assemble(config, read_safetensors(checkpoint), dtype, device), checkpoint)
    gguf = _read_gguf(checkpoint)
    model = _assemble(config, {name: t.dequantize() for name, t in gguf.tensors.items()}, dtype, device)
    if gguf_weights == "quantized" or (gguf_weights == "auto" and torch.device(device).type == "cpu"):
        _keep_quantized(model, gguf, device)
    return LoadedModel(config, model, checkpoint)


def _bias(module: torch.nn.Module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else bias.detach()


def _builtin_yaml(name: str) -> dict[str, Any]:
    data = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text())
    return data if isinstance(data, dict) else {}


def _gguf_source(path: Path) -> ModelSource:
    try:
        return ModelSource(read_config(path), path)
    except GGUFError as err:
        raise ModelLoadError(str(err)) from err


def _read_gguf(path: Path) -> GGUFModel:
    try:
        return read_gguf(path)
    except GGUFError as err:
        raise ModelLoadError(str(err)) from err


FUSED_PROJECTIONS = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def _keep_quantized(model: LlamaForCausalLM, gguf: GGUFModel, device: torch.device | str) -> None:
    """Swap each linear layer whose GGUF weight is quantized for one that keeps it so, fusing the
    projections that share an input (the tied output projection gets its own quantized copy of the
    embedding)."""
    if torch.device(device).type != "cpu":
        raise ModelLoadError(f"quantized GGUF weights run on the CPU kernels only, not on {device}")
    for index in range(model.config.num_hidden_layers):
        for fused, parts in FUSED_PROJECTIONS.items():
            _quantize(model, f"model.layers.{index}.{fused}", parts, gguf)
        _quantize(model, f"model.layers.{index}.self_attn.o_proj", None, gguf)
        _quantize(model, f"model.layers.{index}.mlp.down_proj", None, gguf)
    embedding = gguf.tensors["model.embed_tokens.weight"]
    if model.config.tie_word_embeddings and keeps_quantized(embedding):
        model.lm_head = quantized_linear([embedding], None)
    elif "lm_head.weight" in gguf.tensors:
        _quantize(model, "lm_head", None, gguf)


def _quantize(model: LlamaForCausalLM, module_name: str, parts: tuple[str, ...] | None, gguf: GGUFModel) -> None:
    """Replace `module_name` (or, given `parts`, its sibling linears into one new `module_name`)."""
    parent_name, _, child = module_name.rpartition(".")
    parent = model.get_submodule(parent_name)
    names = parts or (child,)
    prefix = f"{parent_name}." if parent_name else ""
    tensors = [gguf.tensors[f"{prefix}{name}.weight"] for name in names]
    if not all(keeps_quantized(tensor) for tensor in tensors):
        return
    biases = [_bias(parent.get_submodule(name)) for name in names]
    bias = None if any(b is None for b in biases) else torch.cat([b for b in biases if b is not None])
    for name in names:
        delattr(parent, name)
    parent.register_module(child, quantized_linear(tensors, bias))


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
