"""Calibration round trip: samples made from known coefficients are fitted back, saved and reloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agents_eval.sim.calibration.fit import (
    FEATURES,
    KINDS,
    MIN_BATCH_SAMPLES,
    CalibratedTimer,
    Calibration,
    StepSample,
    features,
    fit,
    kind,
)
from agents_eval.sim.model.cost import StepWork
from agents_eval.sim.model.specs import ModelShape

TRUE = {"decode": {"step": 5e-3, "seq": 1e-4, "linear_flop": 2e-12, "attention_flop": 1e-11, "byte": 1e-10},
        "prefill": {"step": 2e-3, "seq": 3e-4, "linear_flop": 1e-11, "attention_flop": 3e-11, "byte": 2e-10}}


def _seconds(work: StepWork, true: dict[str, dict[str, float]] = TRUE) -> float:
    values = features(ModelShape.load("tiny", "float32"), work)
    return sum(true[kind(work)][name] * value for name, value in zip(FEATURES, values, strict=True))


def _samples() -> list[StepSample]:
    """40 decode steps and 40 steps with prompt chunks, of 1-16 sequences."""
    rng, samples = random.Random(0), []
    for prefill in (False, True) * 40:
        seqs = rng.randint(1, 16)
        chunk = [(rng.randint(2, 512) if prefill and i == 0 else 1, rng.randint(0, 1024), True) for i in range(seqs)]
        work = StepWork.of(chunk)
        samples.append(StepSample(work, _seconds(work)))
    return samples


def test_fit_recovers_coefficients_and_file_round_trips(tmp_path: Path) -> None:
    samples = _samples()
    calibration = fit("tiny", "float32", samples, {"host": "test"}, idle_penalty=((0.5, 0.01), (2.0, 0.04)))
    for name in FEATURES:  # a decode step's linear FLOPs are a multiple of its sequences: only its times are unique
        assert calibration.coefficients["prefill"][name] == pytest.approx(TRUE["prefill"][name], rel=1e-6)
    path = tmp_path / "calibration.json"
    calibration.save(path)
    loaded = Calibration.load(path)
    assert loaded == calibration
    timer = CalibratedTimer(loaded)
    for sample in samples:
        assert timer.step_time(sample.work) == pytest.approx(sample.seconds, rel=1e-6)


def test_a_calibration_written_with_the_removed_host_speed_probe_still_loads(tmp_path: Path) -> None:
    calibration = fit("tiny", "float32", _samples())
    path = tmp_path / "calibration.json"
    calibration.save(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "host_reference": {"decode": 0.2, "prefill": 0.3}}))
    assert Calibration.load(path) == calibration


def test_fit_keeps_coefficients_non_negative() -> None:
    shape = ModelShape.load("tiny", "float32")
    samples = [StepSample(s.work, 2e-3 + 1e-11 * features(shape, s.work)[2]) for s in _samples()]
    calibration = fit("tiny", "float32", samples)
    assert all(min(calibration.coefficients[step_kind].values()) >= 0 for step_kind in KINDS)
    assert calibration.coefficients["prefill"]["linear_flop"] == pytest.approx(1e-11, rel=1e-3)
    timer = CalibratedTimer(calibration)
    assert all(timer.step_time(s.work) == pytest.approx(s.seconds, rel=1e-3) for s in samples)


def test_decode_steps_and_prefill_steps_are_fitted_apart() -> None:
    """A sequence more costs a decode step almost nothing; one line through both kinds would miss each."""
    calibration = fit("tiny", "float32", _samples())
    timer = CalibratedTimer(calibration)
    decode, prefill = StepWork.of([(1, 100, True)] * 2), StepWork.of([(64, 100, True), (1, 100, True)])
    assert timer.step_time(decode) == pytest.approx(_seconds(decode), rel=1e-6)
    assert timer.step_time(prefill) == pytest.approx(_seconds(prefill), rel=1e-6)
    with pytest.raises(ValueError, match="need at least 5 decode step samples"):
        fit("tiny", "float32", [s for s in _samples() if kind(s.work) == "prefill"])


def test_idle_penalty_is_interpolated_from_zero_and_held_past_the_last_gap() -> None:
    calibration = fit("tiny", "float32", _samples(), idle_penalty=((0.5, 0.01), (2.0, 0.04)))
    timer = CalibratedTimer(calibration)
    assert timer.after_idle_s(0.0) == 0.0
    assert timer.after_idle_s(0.25) == pytest.approx(0.005)
    assert timer.after_idle_s(1.25) == pytest.approx(0.025)
    assert timer.after_idle_s(60.0) == pytest.approx(0.04)
    assert CalibratedTimer(fit("tiny", "float32", _samples())).after_idle_s(5.0) == 0.0


def test_a_calibration_of_other_features_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.json"  # one set of coefficients, on the features before attention was apart
    path.write_text(json.dumps({"model": "tiny", "dtype": "float32",
                                "coefficients": {"step": 1e-3, "seq": 0.0, "flop": 1e-11, "byte": 0.0}}))
    with pytest.raises(ValueError, match="rerun `agentserve profile`"):
        CalibratedTimer(Calibration.load(path))


def test_each_decode_batch_size_profiled_often_gets_the_median_factor_off_the_line(tmp_path: Path) -> None:
    """Decodes of 2 sequences run 10% under the fitted line, of 4 sequences 10% over: each size seen at least
    MIN_BATCH_SAMPLES times gets its median factor, sizes between are interpolated, beyond held; a size seen
    less often gets none of its own, and prefill steps none at all."""
    rng, samples = random.Random(1), list[StepSample]()
    for seqs, factor, count in ((1, 1.0, 30), (2, 0.9, 30), (4, 1.1, 30), (8, 1.0, MIN_BATCH_SAMPLES - 1)):
        for _ in range(count):
            work = StepWork.of([(1, rng.randint(0, 1024), True)] * seqs)
            samples.append(StepSample(work, _seconds(work) * factor))
    samples += [s for s in _samples() if kind(s.work) == "prefill"]
    calibration = fit("tiny", "float32", samples)
    assert [seqs for seqs, _ in calibration.decode_batch_factors] == [1, 2, 4]
    path = tmp_path / "calibration.json"
    calibration.save(path)
    timer = CalibratedTimer(Calibration.load(path))
    line = CalibratedTimer(Calibration("tiny", "float32", calibration.coefficients))
    factor = {seqs: timer.step_time(w) / line.step_time(w) for seqs in (1, 2, 3, 4, 16)
              for w in [StepWork.of([(1, 500, True)] * seqs)]}
    two, four = dict(calibration.decode_batch_factors)[2], dict(calibration.decode_batch_factors)[4]
    assert two < 0.97 and four > 1.03  # the sizes' own departures from the one line through all
    assert factor[2] == pytest.approx(two) and factor[4] == pytest.approx(four)
    assert factor[3] == pytest.approx((two + four) / 2) and factor[16] == pytest.approx(four)
    prefill = StepWork.of([(64, 100, True), (1, 100, True)])
    assert timer.step_time(prefill) == line.step_time(prefill)


def test_scaled_multiplies_each_kinds_step_time_and_keeps_the_rest() -> None:
    flat = {name: 0.0 for name in FEATURES} | {"step": 0.01, "seq": 0.002}
    calibration = Calibration("tiny", "float32", {"decode": flat, "prefill": flat}, idle_penalty=((1.0, 0.005),),
                              co_run_slowdown={"decode": 1.3})
    scaled = calibration.scaled({"decode": 2.0})
    decode, prefill = StepWork.of([(1, 40, True), (1, 9, True)]), StepWork.of([(24, 0, True)])
    before, after = CalibratedTimer(calibration), CalibratedTimer(scaled)
    assert after.step_time(decode) == pytest.approx(2 * before.step_time(decode))
    assert after.step_time(prefill) == pytest.approx(before.step_time(prefill))
    assert after.after_idle_s(2.0) == before.after_idle_s(2.0) and after.co_run_factor(decode) == 1.3
