"""Think/act phase of an agent turn: types, settings and the per-turn classifier.

An agent alternates between *thinking* (a large new observation to prefill, reasoning expected) and *acting*
(a small delta, a short tool call expected: decode-heavy, latency-bound). `classify_turn` labels one turn;
`trajectory.phase.monitor.PhaseMixMonitor` aggregates the labels of all sessions into a think/act mix and
detects shifts of that mix.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "phase.yaml"
CONFIG_PATH_ENV = "AGENTSERVE_PHASE_CONFIG"


class Phase(enum.Enum):
    THINK = "think"
    ACT = "act"


@dataclass(frozen=True)
class TurnFeatures:
    """What the gateway knows about a turn before running it.

    `recent_output_tokens` holds the session's last few output lengths, oldest first.
    `new_roles` are the roles of the messages this turn appends, e.g. ("tool",) or ("user",).
    """

    delta_tokens: int
    recent_output_tokens: Sequence[int] = ()
    last_turn_had_tool_calls: bool = False
    new_roles: tuple[str, ...] = ()
    tools_available: bool = True


@dataclass(frozen=True)
class PhaseEstimate:
    """`confidence` is the classifier's probability of `phase`, in [0.5, 1]."""

    phase: Phase
    confidence: float

    @property
    def think_probability(self) -> float:
        return self.confidence if self.phase is Phase.THINK else 1.0 - self.confidence


@dataclass(frozen=True)
class MixSample:
    """The think/act mix over the sliding window ending at the time it was taken."""

    think_share: float
    prefill_tokens_per_s: float
    active_decodes: int
    turns_in_window: int


@dataclass(frozen=True)
class PhaseShiftEvent:
    """A detected shift of the mix. `think_share_before`/`_after` are the detector's per-turn think-share
    levels (the baseline before, the mean since the estimated change point); `detection_delay_hint` is
    `timestamp` minus the estimated change point, in seconds."""

    timestamp: float
    direction: Literal["to_think", "to_act"]
    think_share_before: float
    think_share_after: float
    detection_delay_hint: float


class ClassifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bias: float = 0.0
    delta_pivot_tokens: Annotated[float, Field(gt=0)] = 256.0
    delta_weight: float = 1.5
    output_pivot_tokens: Annotated[float, Field(gt=0)] = 128.0
    output_weight: float = 0.75
    output_ema_alpha: Annotated[float, Field(gt=0, le=1)] = 0.5
    tool_loop_weight: float = -0.5
    tools_available_weight: float = -0.25
    role_weights: dict[str, float] = Field(default_factory=lambda: {"user": 0.25, "system": 0.5})


class MixConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: Annotated[float, Field(gt=0)] = 1.0
    load_weight: Annotated[float, Field(ge=0, le=1)] = 0.25
    decode_stream_cost_tokens_per_s: Annotated[float, Field(gt=0)] = 2000.0


class DetectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_shift: Annotated[float, Field(gt=0, le=1)] = 0.4
    threshold: Annotated[float, Field(gt=0)] = 9.5
    baseline_alpha: Annotated[float, Field(gt=0, le=1)] = 0.005
    warmup_turns: Annotated[int, Field(ge=1)] = 20
    refractory_s: Annotated[float, Field(ge=0)] = 0.5


class PhaseConfig(BaseModel):
    """Settings of the classifier, the mix window and the shift detector (`configs/phase.yaml`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    classifier: ClassifierConfig = ClassifierConfig()
    mix: MixConfig = MixConfig()
    detector: DetectorConfig = DetectorConfig()

    @classmethod
    def load(cls, path: Path | str | None = None) -> PhaseConfig:
        """Read `path`, else the file named by `AGENTSERVE_PHASE_CONFIG`, else `configs/phase.yaml`."""
        resolved = Path(path or os.environ.get(CONFIG_PATH_ENV) or DEFAULT_CONFIG_PATH)
        return cls.model_validate(yaml.safe_load(resolved.read_text()) or {})


def output_ema(recent_output_tokens: Sequence[int], alpha: float, prior: float) -> float:
    """Exponential moving average of output lengths, oldest first, starting from `prior`."""
    level = prior
    for tokens in recent_output_tokens:
        level += alpha * (tokens - level)
    return level


def log_ratio(value: float, pivot: float) -> float:
    return math.log1p(max(value, 0.0)) - math.log1p(pivot)


def think_score(features: TurnFeatures, config: ClassifierConfig) -> float:
    """The logit of P(think); see `classify_turn`."""
    expected_output = output_ema(features.recent_output_tokens, config.output_ema_alpha, config.output_pivot_tokens)
    tool_loop = features.last_turn_had_tool_calls and "tool" in features.new_roles
    return (config.bias
            + config.delta_weight * log_ratio(features.delta_tokens, config.delta_pivot_tokens)
            + config.output_weight * log_ratio(expected_output, config.output_pivot_tokens)
            + config.tool_loop_weight * tool_loop
            + config.tools_available_weight * features.tools_available
            + sum(config.role_weights.get(role, 0.0) for role in set(features.new_roles)))


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    exp_z = math.exp(z)
    return exp_z / (1.0 + exp_z)


def classify_turn(features: TurnFeatures, config: ClassifierConfig | PhaseConfig) -> PhaseEstimate:
    """Label a turn THINK or ACT with a logistic score.

        z = bias
            + delta_weight  * (ln(1 + delta_tokens)    - ln(1 + delta_pivot_tokens))
            + output_weight * (ln(1 + expected_output) - ln(1 + output_pivot_tokens))
            + tool_loop_weight       * [last turn called tools and a "tool" message arrives]
            + tools_available_weight * [tools_available]
            + sum of role_weights[r] over the distinct roles r of the new messages
        P(think) = 1 / (1 + exp(-z))

    `expected_output` is the EMA (`output_ema_alpha`, oldest first) of the session's recent output lengths,
    starting from `output_pivot_tokens`, so a session without history contributes nothing. The turn is THINK
    when P(think) >= 0.5, and `confidence` = max(P(think), 1 - P(think)). With the default weights a delta of
    `delta_pivot_tokens` after outputs of `output_pivot_tokens` and no other evidence scores z = 0.
    """
    weights = config.classifier if isinstance(config, PhaseConfig) else config
    p_think = sigmoid(think_score(features, weights))
    if p_think >= 0.5:
        return PhaseEstimate(Phase.THINK, p_think)
    return PhaseEstimate(Phase.ACT, 1.0 - p_think)
