"""Llama-architecture decoder (also Qwen2) in plain torch, attending through the paged KV cache.

Parameter names match Hugging Face `transformers`, so a checkpoint's state dict loads as is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.config import ModelConfig
from engine.model.attention import AttentionMetadata, paged_attention


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one op: a decode step has 61
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)  # in float32, as Hugging Face
        return self.weight * normed.to(x.dtype)


def rope_type(config: ModelConfig) -> str:
    scaling = config.rope_scaling or {}
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def rope_inv_freq(config: ModelConfig) -> Tensor:
    """Inverse frequencies as Hugging Face's rope init functions compute them (float32, on the CPU).

    "dynamic" (NTK) scaling only changes frequencies past `max_position_embeddings`, beyond the table.
    """
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    kind = rope_type(config)
    if kind in ("default", "dynamic"):
        return inv_freq
    assert config.rope_scaling is not None
    if kind == "linear":
        return inv_freq / config.rope_scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, config.rope_scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, linear, dynamic, llama3")


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict) -> Tensor:
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context_len / low, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_context_len / high) * ~(wavelen > old_context_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(config: ModelConfig) -> tuple[Tensor, Tensor]:
    """cos and signed sin, [max_position_embeddings, head_dim] each, in the rotate-half layout: the sin
    table's first half is negated, so rotating half of x is a roll (see `apply_rope`)."""
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(positions, rope_inv_freq(config))
    return torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x: [T, heads, D]; cos, signed_sin: [T, 1, D]. Hugging Face's x * cos + cat(-x2, x1) * sin, bit for bit
    (negating a factor is exact), in four ops instead of seven."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class Attention(nn.Module):
    qkv_proj: nn.Module | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=bias)
        o_bias = bias and config.architecture == "llama"  # Qwen2 has no o_proj bias
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=o_bias)
        self.register_module("qkv_proj", None)  # q, k and v rows stacked, when a loader fuses them

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor,
                attn: AttentionMetadata) -> Tensor:
        q, k, v = self._rotated_qkv(x, cos, sin)
        if attn.query_capture is not None:
            attn.query_capture.add(q)
        out = paged_attention(q, k, v, kv_cache, attn, self.scale)
        return self.o_proj(out.reshape(x.shape[0], self.num_heads * self.head_dim))

    def _rotated_qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [T, H, D], k and v [T, KV, D], with rotary positions applied to q and k."""
        num_tokens, heads, kv_heads = x.shape[0], self.num_heads, self.num_kv_heads
        if self.qkv_proj is None:
            q = apply_rope(self.q_proj(x).view(num_tokens, heads, self.head_dim), cos, sin)
            k = apply_rope(self.k_proj(x).view(num_tokens, kv_heads, self.head_dim), cos, sin)
            return q, k, self.v_proj(x).view(num_tokens, kv_heads, self.head_dim)
        qkv = self.qkv_proj(x).view(num_tokens, heads + 2 * kv_heads, self.head_dim)
        qk = apply_rope(qkv[:, :heads + kv_heads], cos, sin)
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]


class MLP(nn.Module):
    gate_up_proj: nn.Module | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.register_module("gate_up_proj", None)  # gate and up rows stacked, when a loader fuses them

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor,
                attn: AttentionMetadata) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    rope_cos: Tensor
    rope_signed_sin: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Built on the CPU even under a meta-device context, so a model loaded with assign=True is complete.
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_signed_sin", sin, persistent=False)

    def forward(self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor],
                attn: AttentionMetadata) -> Tensor:
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_signed_sin[positions].unsqueeze(1)
        x = self.embed_tokens(input_ids)
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x = layer(x, cos, sin, kv_cache, attn)
            if attn.layer_done is not None:
                attn.layer_done(index)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head: nn.Module | None = None  # tied: logits use the embedding matrix
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: Tensor, positions: Tensor, kv_caches: list[Tensor],
                attn: AttentionMetadata) -> Tensor:
        """input_ids, positions: [T] long. Returns the final-norm hidden states [T, hidden_size]."""
        return self.model(input_ids, positions, kv_caches, attn)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """[N, hidden_size] -> [N, vocab_size] float32."""
        if self.lm_head is None:
            return F.linear(hidden, self.model.embed_tokens.weight).float()
        return self.lm_head(hidden).float()
