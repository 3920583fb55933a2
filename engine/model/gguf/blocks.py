"""GGML quantization blocks unpacked in torch: a row of K weights is K/32 groups of 32 values.

For the 4-bit types every value is `scale * q + offset` with `q` in 0..15 and one (scale, offset) per group
of 32 (Q4_0, Q4_1, and Q4_K's eight sub-blocks of a 256-value super-block); Q8_0 is `scale * q` with `q`
an int8. Byte layouts follow ggml-common.h; the `gguf` package's numpy `dequantize` is the reference in the
tests and the fallback for the types unpacked here only through it (Q6_K and the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QType
from gguf.quants import dequantize as reference_dequantize

GROUP = 32
INT4_TYPES = (QType.Q4_0, QType.Q4_1, QType.Q4_K)
FLOAT_TYPES = {QType.F32: torch.float32, QType.F16: torch.float16, QType.BF16: torch.bfloat16}
SUPPORTED_TYPES = (*FLOAT_TYPES, *INT4_TYPES, QType.Q8_0, QType.Q6_K)


@dataclass
class Int4Groups:
    """q: uint8 [N, K] in 0..15; scale, offset: float32 [N, K/32]; a weight is scale * q + offset."""

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        grouped = self.q.view(n, k // GROUP, GROUP).float()
        return (grouped * self.scale.unsqueeze(-1) + self.offset.unsqueeze(-1)).view(n, k)


def dequantize(data: np.ndarray, qtype: QType, shape: tuple[int, int] | tuple[int]) -> torch.Tensor:
    """The float32 values of a GGUF tensor's raw data; `shape` in torch order (rows, columns)."""
    if qtype in FLOAT_TYPES:
        return _float_tensor(data, qtype).reshape(shape).float()
    if qtype in INT4_TYPES:
        return unpack_int4(data, qtype).dequantize().reshape(shape)
    if qtype == QType.Q8_0:
        q, scale = unpack_q8_0(data)
        return (q.float().view(q.shape[0], -1, GROUP) * scale.unsqueeze(-1)).reshape(shape)
    return torch.from_numpy(np.ascontiguousarray(reference_dequantize(data, qtype))).reshape(shape).float()


def _float_tensor(data: np.ndarray, qtype: QType) -> torch.Tensor:
    raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy())
    return raw.view(FLOAT_TYPES[qtype])


def _rows(data: np.ndarray, block_bytes: int) -> torch.Tensor:
    """uint8 [N, blocks, block_bytes] from a tensor's raw rows."""
    rows = np.ascontiguousarray(data).view(np.uint8)
    rows = rows.reshape(1, -1) if rows.ndim == 1 else rows.reshape(-1, rows.shape[-1])
    return torch.from_numpy(rows.copy()).view(rows.shape[0], -1, block_bytes)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block, as float32 [N, blocks]."""
    return blocks[..., start:start + 2].contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values: low nibbles are the first 16, high nibbles the next 16."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def unpack_int4(data: np.ndarray, qtype: QType) -> Int4Groups:
    if qtype == QType.Q4_0:
        blocks = _rows(data, 18)
        d = _f16(blocks, 0)
        return _groups(_nibbles(blocks[..., 2:]), d, -8 * d)
    if qtype == QType.Q4_1:
        blocks = _rows(data, 20)
        return _groups(_nibbles(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2))
    if qtype == QType.Q4_K:
        return _unpack_q4_k(_rows(data, 144))
    raise ValueError(f"{qtype.name} is not a 4-bit type")


def _groups(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> Int4Groups:
    n = q.shape[0]
    return Int4Groups(q.reshape(n, -1).contiguous(), scale.reshape(n, -1), offset.reshape(n, -1))


def _unpack_q4_k(blocks: torch.Tensor) -> Int4Groups:
    """Super-blocks of 256: d, dmin (f16), 12 bytes of 6-bit (scale, min) for 8 sub-blocks, 128 bytes of q.

    Each 32 bytes of q hold two sub-blocks: low nibbles the first, high nibbles the second.
    """
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    packed = blocks[..., 4:16].long()
    low, high = packed[..., 0:4], packed[..., 4:8]
    extra = packed[..., 8:12]
    scales = torch.cat((low & 63, (extra & 0x0F) | ((low >> 6) << 4)), dim=-1)
    mins = torch.cat((high & 63, (extra >> 4) | ((high >> 6) << 4)), dim=-1)
    qs = blocks[..., 16:].reshape(*blocks.shape[:2], 4, 32)
    q = torch.stack((qs & 0x0F, qs >> 4), dim=3)  # [N, blocks, 4 chunks, 2 sub-blocks, 32]
    return _groups(q, d.unsqueeze(-1) * scales.float(), -dmin.unsqueeze(-1) * mins.float())


def unpack_q8_0(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 q [N, K] and float32 scale [N, K/32]."""
    blocks = _rows(data, 34)
    n = blocks.shape[0]
    q = blocks[..., 2:].contiguous().view(torch.int8).reshape(n, -1)
    return q, _f16(blocks, 0).reshape(n, -1)
