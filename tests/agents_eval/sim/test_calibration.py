"""Calibration round trip: samples made from known coefficients are fitted back, saved and reloaded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents_eval.sim.calibration import FEATURES, CalibratedTimer, Calibration, StepSample, features, fit
from agents_eval.sim.cost import StepWork
from agents_eval.sim.specs import ModelShape

TRUE = {"step": 2e-3, "seq": 3e-4, "flop": 1e-11, "byte": 2e-10}


def _samples() -> list[StepSample]:
    shape, rng, samples = ModelShape.load("tiny", "float32"), random.Random(0), []
    for _ in range(40):
        seqs = rng.randint(1, 16)
        work = StepWork.of((rng.choice([1, rng.randint(2, 512)]), rng.randint(0, 1024), True) for _ in range(seqs))
        seconds = sum(TRUE[name] * value for name, value in zip(FEATURES, features(shape, work), strict=True))
        samples.append(StepSample(work, seconds))
    return samples


def test_fit_recovers_coefficients_and_file_round_trips(tmp_path: Path) -> None:
    samples = _samples()
    calibration = fit("tiny", "float32", samples, {"host": "test"})
    for name in FEATURES:
        assert calibration.coefficients[name] == pytest.approx(TRUE[name], rel=1e-6)
    path = tmp_path / "calibration.json"
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded == calibration
    timer = CalibratedTimer(loaded)
    for sample in samples:
        assert timer.step_time(sample.work) == pytest.approx(sample.seconds, rel=1e-6)


def test_fit_keeps_coefficients_non_negative() -> None:
    samples = [StepSample(s.work, TRUE["step"] + 1e-11 * features(ModelShape.load("tiny", "float32"), s.work)[2])
               for s in _samples()]
    calibration = fit("tiny", "float32", samples)
    assert min(calibration.coefficients.values()) >= 0
    assert calibration.coefficients["flop"] == pytest.approx(1e-11, rel=1e-3)
