"""Linear layers that keep GGUF weights quantized, on torch's CPU weight-only kernels.

- 4-bit (Q4_0, Q4_1, Q4_K): `_weight_int4pack_mm_for_cpu` with one (scale, zero) per group of 32 computes
  `(q - 8) * scale + zero`, which is GGML's `scale * q + offset` exactly with `zero = offset + 8 * scale`.
- Q8_0 and Q6_K: `_weight_int8pack_mm` takes one scale per output row, not per group, so their values are
  requantized to int8 per row (error at most half a step of the row's scale): the one lossy step.

Both kernels are fast with bfloat16 activations and take a slow reference path with float32 ones on CPUs
without AVX-512, so activations are cast to bfloat16 around the matmul and back.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QType
from torch import Tensor, nn

from engine.gguf.blocks import GROUP, INT4_TYPES, unpack_int4
from engine.gguf.reader import GGUFTensor

INT8_TYPES = (QType.Q8_0, QType.Q6_K)
COMPUTE_DTYPE = torch.bfloat16
INT4_INNER_K_TILES = 1  # K must be a multiple of inner_k_tiles * 16; 1 admits every K that is a multiple of 32


def keeps_quantized(tensor: GGUFTensor) -> bool:
    return len(tensor.shape) == 2 and tensor.qtype in (*INT4_TYPES, *INT8_TYPES)


class Int4Linear(nn.Module):
    def __init__(self, tensor: GGUFTensor, bias: Tensor | None) -> None:
        super().__init__()
        groups = unpack_int4(tensor.data, tensor.qtype)
        self.out_features, self.in_features = tensor.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(groups.q.int(), INT4_INNER_K_TILES)
        zero = groups.offset + 8 * groups.scale
        scales_and_zeros = torch.stack((groups.scale, zero), dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(COMPUTE_DTYPE))  # [K/32, N, 2]
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class Int8Linear(nn.Module):
    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(COMPUTE_DTYPE))
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scale)
        out = out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def quantized_linear(tensor: GGUFTensor, bias: Tensor | None) -> nn.Module:
    if tensor.qtype in INT4_TYPES:
        return Int4Linear(tensor, bias)
    return Int8Linear(tensor.dequantize(), bias)
