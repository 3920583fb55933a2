"""How many blocks an engine's paged KV cache gets. In order: `num_kv_blocks` when set, else what
`kv_cache_bytes` affords when set, else a share of the memory the deployment may use: on the CPU
`kv_cache_memory_fraction` of the RAM available at start, on a GPU `kv_cache_device_memory_fraction` of the
device memory free at start (less the weights still to load), split evenly between the engines of a deployment.

The pool is allocated (and zeroed) at start, so a sized cache holds that memory for the engine's life: tests
and benchmarks that start many engines set `num_kv_blocks` or `kv_cache_bytes` (tests/conftest.py does)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil
import torch

from engine.config import EngineSettings, ModelConfig

log = logging.getLogger(__name__)
GIB = 1024**3


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * config.head_dim * element


def weight_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """An upper estimate of the weights' memory at `dtype` (quantized weights take less)."""
    attention = config.hidden_size * config.head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    mlp = 3 * config.hidden_size * config.intermediate_size
    embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    element = torch.empty((), dtype=dtype).element_size()
    return (config.num_hidden_layers * (attention + mlp) + embeddings) * element


@dataclass(frozen=True)
class KVCacheSize:
    num_blocks: int
    block_bytes: int
    block_size: int
    source: str  # what decided the size, for the startup log

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self, model: str) -> str:
        gib = self.num_blocks * self.block_bytes / GIB
        return (f"KV cache: {self.num_tokens:,} tokens of {model} ({self.num_blocks:,} blocks of {self.block_size}, "
                f"{gib:.2f} GiB; {self.source})")


def size_kv_cache(config: ModelConfig, settings: EngineSettings, engines: int = 1,
                  weights_loaded: bool = True) -> KVCacheSize:
    """The cache of one of `engines` engines sharing this host (or device). `weights_loaded` False: the
    engines' weights are not in memory yet (a coordinator sizing its workers' caches) and are set aside."""
    block_bytes = kv_bytes_per_block(config, settings.block_size, getattr(torch, settings.dtype))
    if settings.num_kv_blocks:
        return KVCacheSize(settings.num_kv_blocks, block_bytes, settings.block_size, "num_kv_blocks")
    if settings.kv_cache_bytes:
        return KVCacheSize(max(1, settings.kv_cache_bytes // block_bytes), block_bytes, settings.block_size,
                           "kv_cache_bytes")
    device = torch.device(settings.device)
    available, fraction, what = _usable_memory(device, settings)
    unloaded = 0 if weights_loaded else engines * weight_bytes(config, getattr(torch, settings.dtype))
    budget = max(0, int(available * fraction) - unloaded) // engines
    split = f", split {engines} ways" if engines > 1 else ""
    source = f"{fraction * 100:g}% of {available / GIB:.1f} GiB {what}{split}"
    return KVCacheSize(max(1, budget // block_bytes), block_bytes, settings.block_size, source)


def _usable_memory(device: torch.device, settings: EngineSettings) -> tuple[int, float, str]:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, settings.kv_cache_device_memory_fraction, "free device memory"
    return psutil.virtual_memory().available, settings.kv_cache_memory_fraction, "available RAM"


def sized_settings(config: ModelConfig, settings: EngineSettings, model: str, engines: int = 1,
                   weights_loaded: bool = True) -> EngineSettings:
    """`settings` with the cache's size fixed in blocks (logged), so every process of a deployment agrees."""
    size = size_kv_cache(config, settings, engines, weights_loaded)
    log.info("%s", size.describe(model))
    return settings.model_copy(update={"num_kv_blocks": size.num_blocks})
