"""Model architecture config and engine settings (the engine's one settings class)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from engine.kv_cache.settings import KVCacheSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
MODELS_DIR = CONFIGS_DIR / "models"

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(frozen=True)
class ModelConfig:
    """Llama-family architecture; field names follow Hugging Face `config.json`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"
    seed: int = 0  # for random weights of built-in models
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = ARCHITECTURES.get(archs[0])
        if arch is None:
            raise ValueError(f"unsupported architecture {archs[0]!r}; supported: {sorted(ARCHITECTURES)}")
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        rope_scaling = d.get("rope_scaling") or d.get("rope_parameters")
        rope_theta = (rope_scaling or {}).get("rope_theta") or d.get("rope_theta") or 10000.0
        if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) in (None, "default"):
            rope_scaling = None
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            head_dim=d.get("head_dim") or 0,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
            architecture=arch,
        )

    @classmethod
    def from_json(cls, path: Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads(path.read_text()))

    @classmethod
    def from_yaml(cls, path: Path) -> ModelConfig:
        d = yaml.safe_load(path.read_text())
        d.pop("sampling", None)  # the model's sampling defaults (engine/core/sampling/defaults.py)
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` that `transformers` loads into the same architecture."""
        d = asdict(self)
        for key in ("eos_token_ids", "architecture", "seed", "extra"):
            d.pop(key)
        d["eos_token_id"] = list(self.eos_token_ids)
        d["architectures"] = [k for k, v in ARCHITECTURES.items() if v == self.architecture]
        d["model_type"] = self.architecture
        return d


class YamlSettings(BaseSettings):
    """Settings read from `configs/<config_file>` (or the file named by the `config_env` variable);
    environment variables override the file and constructor arguments override both."""

    config_env: ClassVar[str]
    config_file: ClassVar[str]

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get(cls.config_env, str(CONFIGS_DIR / cls.config_file))
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file)


class EngineSettings(YamlSettings):
    """Engine knobs. Precedence: constructor arguments, then `AGENTSERVE_ENGINE_*` environment variables,
    then `configs/engine.yaml` (or the file named by `AGENTSERVE_ENGINE_CONFIG`), then these defaults."""

    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_ENGINE_", extra="forbid")

    config_env: ClassVar[str] = "AGENTSERVE_ENGINE_CONFIG"
    config_file: ClassVar[str] = "engine.yaml"

    block_size: int = 16
    # The paged KV cache's size (engine/kv_cache/sizing.py): num_kv_blocks, else kv_cache_bytes, else a share of the
    # memory the deployment may use: of the RAM available at start on the CPU, of the free device memory on a GPU
    num_kv_blocks: int | None = Field(default=None, ge=1)
    kv_cache_bytes: int | None = Field(default=None, ge=1)
    kv_cache_memory_fraction: float = Field(default=0.25, gt=0, le=1)
    kv_cache_device_memory_fraction: float = Field(default=0.8, gt=0, le=1)
    max_num_batched_tokens: int = 512  # per-step token budget (chunked prefill)
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    dtype: str = "float32"
    device: str = "cpu"
    num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    step_trace_dir: str | None = None  # each step's time and batch, a JSON line each (engine/core/step_trace.py)
    # A GGUF model's quantized matrices: dequantized at load (exact), kept quantized (CPU int4/int8 kernels), or
    # auto: kept quantized on the CPU, where they step faster (scripts/weights_mode_steps.py), dequantized elsewhere
    gguf_weights: Literal["auto", "dequantize", "quantized"] = "auto"
    # Queue order: fcfs (arrival order) or slo (VIP, TTFT deadline and session fairness;
    # see engine/core/queue_policy.py)
    queue_policy: Literal["fcfs", "slo"] = "fcfs"
    # A streamed reply's outputs: its first token, then every stream_interval tokens, then its end (vLLM's and
    # SGLang's --stream-interval); 1 streams each token. Fewer outputs cost workers, gateway and clients less.
    stream_interval: int = Field(default=1, ge=1)
    # KV tiers below the device pool and the eviction policy (see engine/kv_cache/settings.py)
    kv_cache: KVCacheSettings = Field(default_factory=KVCacheSettings)
