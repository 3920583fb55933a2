"""What the KV transfer benchmark moves: the request's size and shape, the methods and baselines, the goals."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.kv_cache.wire import KVBlock
from engine.transport.base import TransportSettings

TRANSPORTS = ("inproc", "shm", "tcp", "rdma")
NAIVE, RAW, MEMCPY = "naive pickle over TCP", "raw loopback socket", "memcpy (copy_, 1 thread)"
RATIO_GOALS = {"shm_vs_naive": ("shm", NAIVE, 8.0), "shm_vs_memcpy": ("shm", MEMCPY, 0.5),
               "tcp_vs_raw_socket": ("tcp", RAW, 0.6)}
Cache = list[torch.Tensor]


@dataclass(frozen=True)
class KVBenchSettings:
    layers: int = 16
    tokens: int = 2048
    kv_heads: int = 8
    head_dim: int = 64
    block_tokens: tuple[int, ...] = (16, 256)
    dtype: str = "float16"
    repeats: int = 5
    seed: int = 0
    transports: tuple[str, ...] = TRANSPORTS
    transport: TransportSettings = field(default_factory=TransportSettings)

    def validate(self) -> None:
        if min(self.layers, self.tokens, self.kv_heads, self.head_dim, self.repeats, *self.block_tokens) < 1:
            raise ValueError("layers, tokens, kv heads, head dim, block tokens and repeats must be at least 1")
        if any(self.tokens % n for n in self.block_tokens) or self.dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError("tokens must be a multiple of each block size; dtype float16, bfloat16 or float32")
        if unknown := set(self.transports) - set(TRANSPORTS):
            raise ValueError(f"unknown transports {sorted(unknown)}")

    @property
    def request_bytes(self) -> int:
        return 2 * self.layers * self.tokens * self.kv_heads * self.head_dim * getattr(torch, self.dtype).itemsize


def make_cache(settings: KVBenchSettings) -> Cache:
    generator = torch.Generator().manual_seed(settings.seed)
    shape = (2, settings.tokens, settings.kv_heads, settings.head_dim)
    return [torch.randn(shape, generator=generator).to(getattr(torch, settings.dtype)) for _ in range(settings.layers)]


def same_bytes(received: Cache, sent: Cache) -> bool:
    return all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(received, sent, strict=True))


def block_hashes(layer: int, tokens: int, block_tokens: int) -> list[int]:
    """Stand-ins for the blocks' chained hashes: distinct per layer and block."""
    return [layer * 1_000_003 + start for start in range(0, tokens, block_tokens)]


def blocks_of(layer: int, kv: torch.Tensor, block_tokens: int) -> list[KVBlock]:
    """One layer's blocks, one view of its KV each (what the naive path pickles one by one)."""
    return [KVBlock(layer, start, start + block_tokens, block_hash, kv[:, start:start + block_tokens])
            for block_hash, start in zip(block_hashes(layer, kv.shape[1], block_tokens),
                                         range(0, kv.shape[1], block_tokens), strict=True)]
