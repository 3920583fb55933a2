"""Settings of `agentserve bench kv-cache`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agents_eval.harness.report import check_settings
from engine.kv_cache.policy import PolicyName
from predictor.traces import DEFAULT_TRACE

POLICIES: tuple[PolicyName, ...] = ("adaptive", "lfu", "lru")


@dataclass(frozen=True)
class KVCacheBenchSettings:
    trace: Path = DEFAULT_TRACE
    max_requests: int | None = None  # None: the whole trace
    cache_blocks: tuple[int, ...] = (4000, 8000, 16000, 32000, 64000, 128000)  # in the trace's 512-token blocks
    # The persistent tier sized for the default trace's hour: 64,000 of its 182,790 distinct blocks
    configured_blocks: int = 64000
    bound_share: float = 0.95  # goal: the LFU hit ratio at the configured size reaches this share of the bound
    policies: tuple[PolicyName, ...] = field(default=POLICIES)
    tune_decays_s: tuple[float, ...] = (60.0, 300.0, 600.0, 1800.0, 6000.0)  # the fixed LFU's decays tried
    engine_requests: int = 0  # replay this many requests on the tiny engine with tiers too; 0: skip
    engine_device_blocks: int = 96  # its device pool (16-token blocks): small, so eviction demotes
    engine_host_blocks: int = 256  # its host tier; the disk tier takes the host's victims

    def validate(self) -> None:
        check_settings([
            (self.trace.is_file(), f"no trace file at {self.trace}"),
            (bool(self.cache_blocks) and min(self.cache_blocks) > 0, "cache sizes must be positive"),
            (self.configured_blocks > 0, "the configured size must be positive"),
            (self.max_requests is None or self.max_requests > 0, "max_requests must be positive"),
            (0 < self.bound_share <= 1, "bound_share must be in (0, 1]"),
            (self.engine_requests >= 0, "engine_requests must not be negative"),
        ])

    @property
    def sizes(self) -> tuple[int, ...]:
        """The sizes replayed: those asked for and the configured one, ascending."""
        return tuple(sorted({*self.cache_blocks, self.configured_blocks}))
