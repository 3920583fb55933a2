"""Service-level classes: per class a time-to-first-token and a time-per-output-token target, and whether
it is VIP; plus the session-fairness knobs of the SLO queue policy (see batcher). Pure policy, no torch.

`configs/slo.yaml` holds them (`AGENTSERVE_SLO_CONFIG` names another file). A request names its class in
`SamplingParams.slo_class`; the gateway sets it from the caller's API key (`slo_class`, else its priority).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.config import CONFIGS_DIR

CONFIG_ENV = "AGENTSERVE_SLO_CONFIG"


class SloClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float = Field(gt=0)  # deadline of the first token, from arrival
    tpot_s: float = Field(gt=0)  # target gap between output tokens
    vip: bool = False  # ahead of every non-VIP request in both queues


class Fairness(BaseModel):
    """Least attained service per session (Autellix): service is the tokens a session's turns were given,
    halved every half_life_s; every doubling of it past quantum_tokens ranks the session's requests one
    more TTFT later among those of their class, up to max_level more."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    quantum_tokens: int = Field(default=512, ge=1)
    max_level: int = Field(default=4, ge=0)
    half_life_s: float = Field(default=60.0, gt=0)
    max_sessions: int = Field(default=10_000, ge=1)  # least-served sessions are forgotten past this


class SloConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    default_class: str
    classes: dict[str, SloClass]
    fairness: Fairness = Fairness()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.default_class not in self.classes:
            raise ValueError(f"default_class {self.default_class!r} is not one of {sorted(self.classes)}")
        return self

    def slo_class(self, name: str | None) -> SloClass:
        """The named class; the default class for None or a name not configured here."""
        return self.classes.get(name or self.default_class) or self.classes[self.default_class]


def default_config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV, str(CONFIGS_DIR / "slo.yaml")))


def load_slo_config(path: Path | str | None = None) -> SloConfig:
    return SloConfig.model_validate(yaml.safe_load(Path(path or default_config_path()).read_text()))
