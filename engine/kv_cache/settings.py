"""KV tier settings: the `kv_cache` section of configs/engine.yaml (engine.config.EngineSettings.kv_cache)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from engine.kv_cache.policy import LfuWeights, PolicyName


class KVCacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eviction: PolicyName = "adaptive"  # adaptive: recency/frequency balance learned from ghost hits (ARC-style)
    decay_s: float = Field(default=600.0, gt=0)  # `lfu` only: scores decay by exp(-age / decay_s)
    neighbour_share: float = Field(default=1.0, ge=0)  # LFU: share of a child block's accesses credited to its parent
    prefix_share: float = Field(default=1.0, ge=0)  # LFU: credit per sequence branching off a block
    host_blocks: int = Field(default=0, ge=0)  # host tier capacity in blocks; 0: no host tier
    host_path: Path | None = None  # tmpfs folder the node's workers share; None: /dev/shm/agentserve-kv-<uid>
    disk_path: Path | None = None  # persistent tier on local disk; None: none
    disk_max_bytes: int = Field(default=64 * 1024**3, gt=0)  # demotion to disk stops here (or at a full disk)
    redis_url: str | None = None  # persistent tier in Redis; None: none
    redis_ttl_s: int = Field(default=24 * 3600, gt=0)  # a block's lifetime in Redis
    prefetch_lead_s: float = Field(default=0.5, ge=0)  # promote a session's KV this long before its tool result is due
    # When the tool result is due, as a share of the pin's TTL: the gateway pins for the expected gap times
    # its margin (ttl.margin in configs/trajectory.yaml, 1.5), so 1 / 1.5 lands on the expected gap
    prefetch_ttl_share: float = Field(default=2 / 3, gt=0, le=1)
    load_speedup: float = Field(default=1.0, gt=0)  # load when recomputing would take this many times longer
    mask_rule: str = "span-v1"  # fingerprint of the masking rules whose KV the stores hold

    @property
    def weights(self) -> LfuWeights:
        return LfuWeights(self.decay_s, self.neighbour_share, self.prefix_share)
