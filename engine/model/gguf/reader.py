"""A GGUF file's model: its architecture config and its tensors under Hugging Face parameter names.

llama.cpp's converter stores Llama's q/k projection rows permuted for its interleaved rotary layout (pairs
(2i, 2i+1) rotate together); this engine, like `transformers`, rotates halves (i, i + head_dim/2), so the
rows are permuted back here. Qwen2 files are stored unpermuted.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFReader, ReaderTensor

from engine.config import ModelConfig
from engine.model.gguf.blocks import SUPPORTED_TYPES, dequantize

ARCHITECTURES = ("llama", "qwen2")
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
               "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
IGNORED_TENSORS = ("rope_freqs.weight",)


class GGUFError(ValueError):
    """The file is not a GGUF model this engine loads; the message is one line."""


@dataclass
class GGUFTensor:
    """One tensor's raw data, still in its GGML type, with its torch shape (rows, columns) or (length,)."""

    name: str  # Hugging Face parameter name
    qtype: QType
    shape: tuple[int, ...]
    data: np.ndarray

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.data, self.qtype, self.shape)  # type: ignore[arg-type]


@dataclass
class GGUFModel:
    path: Path
    config: ModelConfig
    tensors: dict[str, GGUFTensor]


def open_gguf(path: Path) -> GGUFReader:
    """The file's reader, shared by the config, weights and tokenizer (parsing the metadata of a 49k-token
    vocabulary takes seconds)."""
    try:
        stat = Path(path).stat()
    except OSError as err:
        raise GGUFError(f"cannot read {path}: {_first_line(err)}") from err
    return _open_gguf(Path(path).resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _open_gguf(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError, TypeError) as err:
        raise GGUFError(f"{path} is not a readable GGUF file: {_first_line(err)}") from err


def read_config(path: Path) -> ModelConfig:
    return config_from_reader(open_gguf(path), path)


def read_gguf(path: Path) -> GGUFModel:
    reader = open_gguf(path)
    config = config_from_reader(reader, path)
    tensors = {}
    for tensor in reader.tensors:
        if tensor.name in IGNORED_TENSORS:
            continue
        converted = _convert(tensor, config, path)
        tensors[converted.name] = converted
    return GGUFModel(path, config, tensors)


def field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    found = reader.fields.get(key)
    return default if found is None else found.contents()


def config_from_reader(reader: GGUFReader, path: Path) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: unsupported architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    try:
        return _config(reader, arch)
    except (KeyError, TypeError, ValueError) as err:
        raise GGUFError(f"{path}: incomplete model metadata: {_first_line(err)}") from err


def _config(reader: GGUFReader, arch: str) -> ModelConfig:
    def required(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise KeyError(f"{arch}.{key} missing")
        return value

    heads = int(required("attention.head_count"))
    hidden = int(required("embedding_length"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        vocab_size=int(field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens else required("vocab_size"))),
        hidden_size=hidden,
        intermediate_size=int(required("feed_forward_length")),
        num_hidden_layers=int(required("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(field(reader, f"{arch}.attention.head_count_kv") or heads),
        max_position_embeddings=int(required("context_length")),
        head_dim=int(field(reader, f"{arch}.attention.key_length") or hidden // heads),
        rms_norm_eps=float(required("attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base") or 10000.0),
        rope_scaling=_rope_scaling(reader, arch),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        architecture=arch,
    )


def _rope_scaling(reader: GGUFReader, arch: str) -> dict[str, Any] | None:
    kind = field(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise ValueError(f"unsupported rope scaling {kind!r}; supported: linear")
    return {"rope_type": "linear", "factor": float(field(reader, f"{arch}.rope.scaling.factor"))}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    match = LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in LAYER_NAMES:
        return None
    index, part, kind = match.groups()
    return f"model.layers.{index}.{LAYER_NAMES[part]}.{kind}"


def _convert(tensor: ReaderTensor, config: ModelConfig, path: Path) -> GGUFTensor:
    name = hf_name(tensor.name)
    if name is None:
        raise GGUFError(f"{path}: unexpected tensor {tensor.name!r}")
    qtype = QType(tensor.tensor_type)
    if qtype not in SUPPORTED_TYPES:
        supported = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise GGUFError(f"{path}: tensor {tensor.name} has unsupported type {qtype.name}; supported: {supported}")
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    data = tensor.data
    if config.architecture == "llama" and tensor.name.endswith(("attn_q.weight", "attn_k.weight", "attn_q.bias",
                                                                "attn_k.bias")):
        heads = config.num_attention_heads if ".attn_q." in tensor.name else config.num_key_value_heads
        data = unpermute_rows(data, heads)
    return GGUFTensor(name, qtype, shape, data)


def unpermute_rows(data: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head from llama.cpp's interleaved order (pairs) back to halves: the inverse of the
    converter's `w.reshape(heads, 2, rows // heads // 2, ...).swapaxes(1, 2)`. Rows stay whole, so this works
    on quantized rows too."""
    rows = data.shape[0]
    rest = data.shape[1:]
    return np.ascontiguousarray(data.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(data.shape))


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__
