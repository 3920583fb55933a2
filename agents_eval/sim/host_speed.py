"""How fast this shared host runs the engine right now: a fixed probe (two 256-token prompts and their replies,
through an in-process `LLMEngine` with one thread), its prefill and decode steps timed apart.

This host's speed drifts by 10-15% from one minute to the next with what its other tenants run, and a profile
carries the speed of its own minutes. So `agentserve profile` times the probe between its sections and keeps the
median per step kind (`Calibration.host_reference`), the validation times it before and after each real run,
and the simulator, told the ratio (`ClusterConfig.host_speed`), runs the calibrated step times at the speed the
host had around that run. The probe is timed outside the runs and nothing is fitted on them."""

from __future__ import annotations

import random
import statistics
from typing import TYPE_CHECKING

from agents_eval.sim.calibration import KINDS, Calibration, kind

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

PROBE_PROMPTS, PROBE_PROMPT_TOKENS, PROBE_REPLY_TOKENS = 2, 256, 16
PROBE_REPEATS = 3


def probe(engine: LLMEngine, repeats: int = PROBE_REPEATS) -> dict[str, float]:
    """Per step kind, the median over `repeats` of the probe's summed step seconds of that kind (after one
    untimed pass)."""
    from agents_eval.sim.profile import _round, _tokens

    rng = random.Random(7)  # fresh prompts each repeat: the prefix cache must not serve them
    totals: dict[str, list[float]] = {name: [] for name in KINDS}
    # an untimed pass first: an engine idle through a run finds its weights evicted from the shared cache, and
    # its first steps after would time that (3.5x the profile's prefill in one validation run), not the host
    _round(engine, [_tokens(engine, rng, PROBE_PROMPT_TOKENS) for _ in range(PROBE_PROMPTS)], PROBE_REPLY_TOKENS)
    for _ in range(repeats):
        samples = _round(engine, [_tokens(engine, rng, PROBE_PROMPT_TOKENS) for _ in range(PROBE_PROMPTS)],
                         PROBE_REPLY_TOKENS)
        for name in KINDS:
            totals[name].append(sum(s.seconds for s in samples if kind(s.work) == name))
    return {name: statistics.median(seconds) for name, seconds in totals.items()}


def combine(probes: list[dict[str, float]]) -> dict[str, float]:
    """Several probes' figures as one: the median per step kind."""
    if not probes:
        raise ValueError("no host-speed probe to combine")
    return {name: statistics.median(p[name] for p in probes) for name in KINDS}


def speed_factors(calibration: Calibration, around_run: dict[str, float]) -> dict[str, float]:
    """Per step kind, how much slower (> 1) or faster the host ran the probe around a run than during the
    profile; empty (the calibrated times as they are) for a calibration written before the probe existed."""
    reference = calibration.host_reference
    if not reference:
        return {}
    return {name: around_run[name] / reference[name] for name in KINDS}
