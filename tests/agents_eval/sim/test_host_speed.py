"""The host-speed probe: timed per step kind on a real engine, combined by median, and turned into factors on a
calibration's step times that scale exactly the kind they were measured on."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from agents_eval.sim.calibration import KINDS, CalibratedTimer, Calibration, StepSample, fit
from agents_eval.sim.cost import StepWork
from agents_eval.sim.host_speed import combine, probe, speed_factors
from agents_eval.sim.validate import cpu_cluster, predict
from agents_eval.sim.workload import from_workload
from agents_eval.workloads import swe
from engine.config import EngineSettings
from engine.llm_engine import LLMEngine

DECODE = StepWork.of([(1, 300, True), (1, 500, True)])
PREFILL = StepWork.of([(200, 0, True)])


def _calibration(host_reference: dict[str, float] | None) -> Calibration:
    rng, samples = random.Random(0), []
    for i in range(40):
        seqs = rng.randint(1, 8)
        work = StepWork.of([(rng.randint(8, 256) if i % 2 and j == 0 else 1, rng.randint(0, 512), True)
                            for j in range(seqs)])
        samples.append(StepSample(work, 0.01 + 1e-4 * work.tokens + 1e-3 * seqs))
    return fit("tiny", "float32", samples, host_reference=host_reference)


def test_probe_times_both_step_kinds_on_a_real_engine() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_threads=1))
    timed = probe(engine, repeats=2)
    assert set(timed) == set(KINDS) and min(timed.values()) > 0
    assert not engine.has_unfinished()


def test_probes_combine_by_median_per_kind() -> None:
    probes = [{"decode": 0.1, "prefill": 0.5}, {"decode": 0.3, "prefill": 0.4}, {"decode": 0.2, "prefill": 0.9}]
    assert combine(probes) == {"decode": 0.2, "prefill": 0.5}
    with pytest.raises(ValueError, match="no host-speed probe"):
        combine([])


def test_speed_factors_scale_the_step_time_of_their_kind() -> None:
    calibration = _calibration({"decode": 0.2, "prefill": 0.4})
    factors = speed_factors(calibration, {"decode": 0.22, "prefill": 0.36})
    assert factors == pytest.approx({"decode": 1.1, "prefill": 0.9})
    plain, scaled = CalibratedTimer(calibration), CalibratedTimer(calibration, host_speed=factors)
    assert scaled.step_time(DECODE) == pytest.approx(1.1 * plain.step_time(DECODE))
    assert scaled.step_time(PREFILL) == pytest.approx(0.9 * plain.step_time(PREFILL))
    assert scaled.after_idle_s(1.0) == plain.after_idle_s(1.0)  # the idle penalty is not the host's speed


def test_the_validation_predicts_a_run_at_its_host_speed(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    _calibration({"decode": 0.2, "prefill": 0.4}).save(path)
    sessions = from_workload(swe.build(seed=0, rate=0.3, duration_s=20.0, max_requests=40))
    plain = predict(cpu_cluster("colocated", path, "tiny"), sessions)
    slow = predict(cpu_cluster("colocated", path, "tiny", {"decode": 1.5, "prefill": 1.5}), sessions)
    assert len(slow) == len(plain) > 0
    assert np.median(slow[:, 1]) > 1.3 * np.median(plain[:, 1])  # TPOT: decode steps only
    assert np.median(slow[:, 0]) > 1.2 * np.median(plain[:, 0])


def test_a_calibration_without_a_reference_is_taken_as_it_is() -> None:
    assert speed_factors(_calibration(None), {"decode": 0.5, "prefill": 0.5}) == {}
