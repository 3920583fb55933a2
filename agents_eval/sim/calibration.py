"""A step-time model fitted to measured engine steps (`agentserve profile` writes it, `simulate` reads it).

time = c_step + c_seq x sequences + c_flop x FLOPs + c_byte x bytes, FLOPs and bytes from the cost model
(`cost`), fitted by non-negative least squares on relative error (each step weighted by 1 / its time, so short
decode steps count as much as long prefills). The file keeps the samples it was fitted on, so a fit can be
checked or redone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agents_eval.sim.cost import StepWork, step_bytes, step_flops
from agents_eval.sim.specs import ModelShape

FEATURES = ("step", "seq", "flop", "byte")


@dataclass(frozen=True)
class StepSample:
    work: StepWork
    seconds: float


@dataclass(frozen=True)
class Calibration:
    model: str
    dtype: str
    coefficients: dict[str, float]  # seconds per unit of each of FEATURES
    machine: dict[str, object] = field(default_factory=dict)
    samples: tuple[StepSample, ...] = ()

    def save(self, path: Path) -> None:
        data = {**asdict(self), "samples": [{**asdict(s.work), "seconds": s.seconds} for s in self.samples]}
        path.write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: Path) -> Calibration:
        data = json.loads(path.read_text())
        samples = tuple(StepSample(StepWork(**{k: v for k, v in s.items() if k != "seconds"}), s["seconds"])
                        for s in data.pop("samples", []))
        return cls(**data, samples=samples)


def features(shape: ModelShape, work: StepWork) -> list[float]:
    return [1.0, float(work.seqs), step_flops(shape, work), step_bytes(shape, work)]


def fit(model: str, dtype: str, samples: list[StepSample], machine: dict[str, object] | None = None) -> Calibration:
    if len(samples) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} step samples to fit, got {len(samples)}")
    shape = ModelShape.load(model, dtype)
    x = np.array([features(shape, s.work) for s in samples])
    y = np.array([s.seconds for s in samples])
    coefficients = _nonnegative_lstsq(x / y[:, None], np.ones(len(y)))
    return Calibration(model, dtype, dict(zip(FEATURES, map(float, coefficients), strict=True)), machine or {},
                       tuple(samples))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative one and refit until none is."""
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    active = list(range(a.shape[1]))
    while True:
        solution = np.zeros(a.shape[1])
        solution[active] = np.linalg.lstsq(a[:, active] / scale[active], b, rcond=None)[0] / scale[active]
        if solution.min() >= 0:
            return solution
        active.remove(int(np.argmin(solution)))


class CalibratedTimer:
    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._shape = ModelShape.load(calibration.model, calibration.dtype)
        self._coefficients = [calibration.coefficients[name] for name in FEATURES]

    def step_time(self, work: StepWork) -> float:
        if not work.tokens:
            return 0.0
        return float(sum(c * f for c, f in zip(self._coefficients, features(self._shape, work), strict=True)))
