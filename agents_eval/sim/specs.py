"""Device and model specs for the cost model: `configs/devices/<name>.yaml` (datasheet peaks, efficiency
factors, price) and `configs/models/<name>.yaml` (a `ModelConfig`; an MoE carries `extra.num_experts`,
`extra.num_experts_per_tok` and `extra.moe_intermediate_size`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

from engine.capacity.tune import DTYPE_BYTES
from engine.config import CONFIGS_DIR, ModelConfig

DEVICES_DIR = CONFIGS_DIR / "devices"


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_flops: float  # FLOP/s, dense
    memory_bandwidth: float  # bytes/s
    memory_bytes: float
    interconnect_bandwidth: float  # bytes/s per device, between the devices of one tensor-parallel group
    flops_efficiency: float
    bandwidth_efficiency: float
    step_overhead_s: float
    price_per_gpu_hour: float

    @classmethod
    def load(cls, name_or_path: str) -> DeviceSpec:
        path = Path(name_or_path) if name_or_path.endswith(".yaml") else DEVICES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in DEVICES_DIR.glob("*.yaml")))
            raise ValueError(f"unknown device {name_or_path!r}; one of {known} or a YAML path")
        data = yaml.safe_load(path.read_text())
        name = str(data.pop("name"))
        return cls(name, **{key: float(value) for key, value in data.items()})


@dataclass(frozen=True)
class ModelShape:
    """What a step costs per token, from the architecture. Parameter counts exclude the embedding table (a
    lookup, no FLOPs); the LM head counts only for tokens that are sampled."""

    layers: int
    hidden: int
    q_width: int  # query heads x head dim
    kv_width: int  # KV heads x head dim
    vocab: int
    dense_mlp_params: int  # per layer, read and computed by every token (0 for an MoE)
    expert_params: int  # per expert per layer
    num_experts: int
    experts_per_token: int
    dtype_bytes: int = 2

    @classmethod
    def from_config(cls, config: ModelConfig, dtype: str = "bfloat16") -> ModelShape:
        extra = config.extra or {}
        experts = int(extra.get("num_experts", 0))
        width = int(extra.get("moe_intermediate_size", config.intermediate_size))
        mlp = 3 * config.hidden_size * (width if experts else config.intermediate_size)
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads * config.head_dim,
                   config.num_key_value_heads * config.head_dim, config.vocab_size, 0 if experts else mlp,
                   mlp if experts else 0, experts, int(extra.get("num_experts_per_tok", 0)), DTYPE_BYTES[dtype])

    @classmethod
    def load(cls, name: str, dtype: str = "bfloat16") -> ModelShape:
        """A built-in model's name (configs/models, GGUF included), a checkpoint directory or a YAML path."""
        from engine.model.loader import resolve_model  # imports torch; a YAML path does not need it

        config = ModelConfig.from_yaml(Path(name)) if name.endswith(".yaml") else resolve_model(name).config
        return cls.from_config(config, dtype)

    @cached_property
    def attention_params(self) -> int:
        """Per layer: q, k, v and o projections."""
        return 2 * self.hidden * self.q_width + 2 * self.hidden * self.kv_width

    @cached_property
    def router_params(self) -> int:
        return self.hidden * self.num_experts

    @cached_property
    def active_params(self) -> int:
        """Per token, all layers, LM head excluded."""
        mlp = self.dense_mlp_params + self.experts_per_token * self.expert_params + self.router_params
        return self.layers * (self.attention_params + mlp)

    @cached_property
    def total_params(self) -> int:
        mlp = self.dense_mlp_params + self.num_experts * self.expert_params + self.router_params
        return self.layers * (self.attention_params + mlp) + 2 * self.vocab * self.hidden

    @cached_property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_width * self.dtype_bytes
