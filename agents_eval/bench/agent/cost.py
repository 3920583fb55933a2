"""What a configuration's run cost: the engine's resources (CPU cores, GPUs) x the hours of the measured
window, at the prices of `configs/cost.yaml` (`AGENTSERVE_COST_*` overrides), spread over the tokens served.

Cores are the engine's torch threads: a colocated engine's `num_threads`, or the disaggregated workers'
count x `threads_per_worker`, so a colocated engine with 2 threads and two 1-thread workers cost the same.
Off the CPU, local worker processes share the one device the engine names (`AGENTSERVE_ENGINE_DEVICE`), so they
hold one GPU however many there are; Ray-placed workers, each on a node of its own role, one each. Cached prompt tokens
are not served work: the cost is quoted per 1,000 generated tokens, per 1,000 computed (uncached) prompt
tokens, and per 1,000 of both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic_settings import SettingsConfigDict

from engine.config import EngineSettings, YamlSettings
from engine.workers.deployment import DeploymentSettings

SECONDS_PER_HOUR = 3600.0
COLOCATED = "colocated"


class CostSettings(YamlSettings):
    config_env: ClassVar[str] = "AGENTSERVE_COST_CONFIG"
    config_file: ClassVar[str] = "cost.yaml"
    model_config = SettingsConfigDict(env_prefix="AGENTSERVE_COST_", extra="forbid")

    price_per_core_hour: float = 0.05
    price_per_gpu_hour: float = 2.5


@dataclass(frozen=True)
class Resources:
    cores: int
    gpus: int = 0

    def price_per_hour(self, prices: CostSettings) -> float:
        return self.cores * prices.price_per_core_hour + self.gpus * prices.price_per_gpu_hour


def engine_resources(env: Mapping[str, str], split: Mapping[str, int]) -> Resources:
    """The cores and GPUs of a gateway's engine, from the environment it was started with (over the config
    files and this process's environment) and its prefill/decode split (`{"colocated": 1}` when colocated)."""
    engine = EngineSettings(**_overrides(env, "AGENTSERVE_ENGINE_", {"num_threads", "device"}))
    gpus = 0 if engine.device == "cpu" else 1
    if not split or set(split) == {COLOCATED}:
        return Resources(engine.num_threads or os.cpu_count() or 1, gpus)
    keys = {"threads_per_worker", "placement", "transport"}
    deployment = DeploymentSettings(**_overrides(env, "AGENTSERVE_DEPLOYMENT_", keys))
    processes = sum(split.values())
    on_ray = deployment.placement == "ray"
    return Resources(processes * deployment.worker_threads, gpus * processes if on_ray else gpus)


def _overrides(env: Mapping[str, str], prefix: str, keys: set[str]) -> dict[str, Any]:
    named = {key.removeprefix(prefix).lower(): value for key, value in env.items() if key.startswith(prefix)}
    return {key: value for key, value in named.items() if key in keys}


def per_1k(cost: float, tokens: float) -> float:
    return cost / tokens * 1000.0 if tokens > 0 else math.nan


def cost_figures(resources: Resources, prices: CostSettings, window_s: float, output_tokens: int,
                 prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The run's cost in dollars and per 1,000 tokens of each kind; cached prompt tokens count for nothing."""
    hours = window_s / SECONDS_PER_HOUR
    cost = resources.price_per_hour(prices) * hours
    computed = prompt_tokens - cached_tokens
    return {"cores": resources.cores, "gpus": resources.gpus, "core_hours": resources.cores * hours,
            "gpu_hours": resources.gpus * hours, "cost_usd": cost, "computed_prompt_tokens": computed,
            "cost_per_1k_output_tokens": per_1k(cost, output_tokens),
            "cost_per_1k_prompt_tokens": per_1k(cost, computed),
            "cost_per_1k_tokens": per_1k(cost, computed + output_tokens)}
