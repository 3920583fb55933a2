"""Load or recompute: a block in a lower tier is loaded when its bytes over the tier's measured bandwidth
take less time than its tokens over the measured prefill rate (times `load_speedup`). Pure policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.stats import ema


@dataclass
class LoadDecision:
    prefill_tokens_per_s: Callable[[], float]  # 0: not measured yet
    load_speedup: float = 1.0  # load only when recomputing takes this many times longer
    alpha: float = 0.2
    bytes_per_s: dict[str, float] = field(default_factory=dict)  # per tier, measured on loads
    loaded: int = 0  # blocks
    recomputed: int = 0  # blocks a lower tier held but recomputing was cheaper

    def observe(self, tier: str, nbytes: int, seconds: float) -> None:
        rate = nbytes / max(seconds, 1e-9)
        self.bytes_per_s[tier] = ema(self.bytes_per_s.get(tier, 0.0), rate, self.alpha)

    def load_s(self, tier: str, nbytes: int) -> float | None:
        bandwidth = self.bytes_per_s.get(tier, 0.0)
        return nbytes / bandwidth if bandwidth else None

    def recompute_s(self, tokens: int) -> float | None:
        rate = self.prefill_tokens_per_s()
        return tokens / rate if rate else None

    def worth_loading(self, tier: str, nbytes: int, tokens: int) -> bool:
        """Unmeasured tiers or prefill rates load (that is how they get measured)."""
        load_s, recompute_s = self.load_s(tier, nbytes), self.recompute_s(tokens)
        return load_s is None or recompute_s is None or load_s * self.load_speedup <= recompute_s
