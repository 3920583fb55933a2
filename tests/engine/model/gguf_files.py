"""Small GGUF model files written with the `gguf` package, laid out as llama.cpp's converter writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf import GGUFWriter
from gguf.quants import quantize

from engine.model.gguf.reader import GLOBAL_NAMES, LAYER_NAMES

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB, CONTEXT = 256, 512, 2, 4, 2, 320, 256
QUANTIZABLE = (QType.F32, QType.F16, QType.BF16, QType.Q8_0, QType.Q4_0, QType.Q4_1, QType.Q5_0)
BLOCK_BYTES = {QType.Q4_K: 144, QType.Q6_K: 210}  # gguf cannot quantize these: random bytes, sane scales
SCALE_OFFSETS = {QType.Q4_K: (0, 2), QType.Q6_K: (208,)}


def random_state(arch: str, tie: bool, seed: int) -> dict[str, torch.Tensor]:
    """Hugging Face parameter names and shapes of a tiny Llama or Qwen2."""
    generator = torch.Generator().manual_seed(seed)
    head_dim = HIDDEN // HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not tie:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        shapes |= {f"{layer}.self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
                   f"{layer}.self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
                   f"{layer}.self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
                   f"{layer}.self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
                   f"{layer}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
                   f"{layer}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
                   f"{layer}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
                   f"{layer}.input_layernorm.weight": (HIDDEN,),
                   f"{layer}.post_attention_layernorm.weight": (HIDDEN,)}
        if arch == "qwen2":
            shapes |= {f"{layer}.self_attn.{p}_proj.bias": (n * head_dim,)
                       for p, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}
    state = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        state[name] = 1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise
    return state


def gguf_name(hf_name: str) -> str:
    for gguf, hf in GLOBAL_NAMES.items():
        if hf == hf_name:
            return gguf
    parts = hf_name.split(".")
    index, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    [short] = [k for k, v in LAYER_NAMES.items() if v == module]
    return f"blk.{index}.{short}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of q/k rows (halves -> interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(values: np.ndarray, qtype: QType, seed: int) -> np.ndarray:
    if qtype in QUANTIZABLE:
        return quantize(values, qtype)
    return random_blocks(values.shape, qtype, seed)


def random_blocks(shape: tuple[int, ...], qtype: QType, seed: int, scale: float = 0.0002) -> np.ndarray:
    """Valid blocks of a K-quant type with random quants and small random scales."""
    rng = np.random.default_rng(seed)
    rows, columns = int(np.prod(shape[:-1])), shape[-1]
    block_bytes = BLOCK_BYTES[qtype]
    blocks = rng.integers(0, 256, (rows, columns // 256, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[qtype]:
        scales = rng.uniform(-scale, scale, blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(*shape[:-1], -1)


def write_gguf(path: Path, arch: str = "llama", qtype: QType = QType.F32, tie: bool = False, seed: int = 0,
               architecture_name: str | None = None) -> Path:
    """Matrices in `qtype`, norms and biases in F32; q/k rows permuted for Llama as llama.cpp stores them."""
    writer = GGUFWriter(str(path), architecture_name or arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for i, (name, tensor) in enumerate(random_state(arch, tie, seed).items()):
        values = tensor.numpy()
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            values = permute(values, HEADS if ".q_proj." in name else KV_HEADS)
        matrix = values.ndim == 2
        kind = qtype if matrix else QType.F32
        data = encode(values, kind, seed + i)
        writer.add_tensor(gguf_name(name), data, raw_shape=data.shape if kind == QType.F32 else None,
                          raw_dtype=None if kind == QType.F32 else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
