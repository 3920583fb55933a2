"""Linear layers that keep GGUF weights quantized, on torch's CPU weight-only kernels.

- 4-bit (Q4_0, Q4_1, Q4_K): `_weight_int4pack_mm_for_cpu` with one (scale, zero) per group of 32 computes
  `(q - 8) * scale + zero`, which is GGML's `scale * q + offset` exactly with `zero = offset + 8 * scale`.
- Q8_0 and Q6_K: `_weight_int8pack_mm` takes one scale per output row, not per group, so their values are
  requantized to int8 per row (error at most half a step of the row's scale): the one lossy step.

Projections that read the same input are fused into one matrix at load (q, k, v into `qkv_proj`; gate
and up into `gate_up_proj`): a decode step then makes four kernel calls per layer instead of seven, and
the call, not the bytes, is most of a small matrix's cost.

Both kernels are fast with bfloat16 activations and take a slow reference path with float32 ones on CPUs
without AVX-512, so activations are cast to bfloat16 around the matmul and back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gguf import GGMLQuantizationType as QType
from torch import Tensor, nn

from engine.model.gguf.blocks import GROUP, INT4_TYPES, unpack_int4
from engine.model.gguf.reader import GGUFTensor

INT8_TYPES = (QType.Q8_0, QType.Q6_K)
COMPUTE_DTYPE = torch.bfloat16
INT4_INNER_K_TILES = 1  # K must be a multiple of inner_k_tiles * 16; 1 admits every K that is a multiple of 32


def keeps_quantized(tensor: GGUFTensor) -> bool:
    return len(tensor.shape) == 2 and tensor.qtype in (*INT4_TYPES, *INT8_TYPES)


class Int4Linear(nn.Module):
    """The rows of `parts` stacked in order: one matrix of their summed output features."""

    def __init__(self, parts: Sequence[GGUFTensor], bias: Tensor | None) -> None:
        super().__init__()
        unpacked = [unpack_int4(part.data, part.qtype) for part in parts]
        q, scale, offset = (torch.cat([getattr(g, field) for g in unpacked]) for field in ("q", "scale", "offset"))
        self.out_features, self.in_features = q.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.int(), INT4_INNER_K_TILES)
        zero = offset + 8 * scale
        scales_and_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(COMPUTE_DTYPE))  # [K/32, N, 2]
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            return self(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(COMPUTE_DTYPE), self.packed, GROUP, self.scales_and_zeros)
        return out.to(x.dtype) if self.bias is None else out.to(x.dtype).add_(self.bias)


class Int8Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(COMPUTE_DTYPE))
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            return self(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        out = torch.ops.aten._weight_int8pack_mm(x.to(COMPUTE_DTYPE), self.weight_int8, self.scale)
        return out.to(x.dtype) if self.bias is None else out.to(x.dtype).add_(self.bias)


def quantized_linear(parts: Sequence[GGUFTensor], bias: Tensor | None) -> nn.Module:
    """One layer of the parts' rows stacked; 8-bit per row if any part is not a 4-bit type."""
    if all(part.qtype in INT4_TYPES for part in parts):
        return Int4Linear(parts, bias)
    return Int8Linear(torch.cat([part.dequantize() for part in parts]), bias)
