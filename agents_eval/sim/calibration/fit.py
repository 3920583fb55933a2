"""A step-time model fitted to measured engine steps (`agentserve profile` writes it, `simulate` reads it).

time = c_step + c_seq x sequences + c_linear x linear FLOPs + c_attention x attention FLOPs + c_byte x bytes,
FLOPs and bytes from the cost model (`cost`; attention apart from the weights' matmuls, as an engine's attention
over a cached prefix runs at a rate of its own), fitted by non-negative least squares on relative error (each
step weighted by 1 / its time, so short decode steps count as much as long prefills). Decode steps (one new
token per sequence) and steps that compute a prompt chunk are fitted apart (`KINDS`): a decode step is bound
by reading the weights and the KV, where a sequence more costs almost nothing, a prefill by its matmuls; one
line through both misses each. The engine's decode step does not grow in a line with its sequences (its matmul
kernels change shape with the batch: here 2 and 3 sequences run 5-9% under the line, 4 and 5 as much over), so
each decode batch size the profile ran often enough gets a factor, the median of measured over fitted
(`decode_batch_factors`, interpolated between sizes and held beyond them). The file keeps the samples it was
fitted on, so a fit can be checked or redone.

`idle_penalty`: what a worker's first step after an idle gap costs beyond the same step run back to back, as
(gap seconds, extra seconds) points, interpolated and held beyond the last: on a shared host, other tenants
evict an idle process's weights from the cache, so the step after a tool gap reads them from memory again.

`co_run_slowdown`: per step kind, how much longer a step takes while another engine process on the host is
stepping (they share its memory bandwidth and cache); a calibrated cluster's workers all run on the host it
describes, so each pays it on a step that starts while another is mid-step.

`worker_hop_s`: what a request served by a worker process pays over one served in process: its trip to the
worker and its first token's trip back (messages over pipes, the coordinator's poll), measured by the profile;
`worker_idle_penalty`: the idle penalty of a worker process, which pays more than the in-process engine to
wake from its wait. A cluster of worker processes (`ClusterConfig.worker_processes`) pays both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from agents_eval.sim.model.cost import StepWork, attention_flops, linear_flops, step_bytes
from agents_eval.sim.model.specs import ModelShape

FEATURES = ("step", "seq", "linear_flop", "attention_flop", "byte")
KINDS = ("decode", "prefill")  # a step of decodes only; a step computing a prompt chunk (decodes may join it)
MIN_BATCH_SAMPLES = 20  # decode steps of one batch size that earn it a factor of its own


@dataclass(frozen=True)
class StepSample:
    work: StepWork
    seconds: float


@dataclass(frozen=True)
class Calibration:
    model: str
    dtype: str
    coefficients: dict[str, dict[str, float]]  # per step kind of KINDS, seconds per unit of each of FEATURES
    machine: dict[str, object] = field(default_factory=dict)
    samples: tuple[StepSample, ...] = ()
    idle_penalty: tuple[tuple[float, float], ...] = ()  # (idle gap s, extra s of the first step after it)
    decode_batch_factors: tuple[tuple[int, float], ...] = ()  # (sequences, measured / fitted) of decode steps
    worker_hop_s: float = 0.0
    worker_idle_penalty: tuple[tuple[float, float], ...] = ()
    co_run_slowdown: dict[str, float] = field(default_factory=dict)  # step kind -> factor

    def save(self, path: Path) -> None:
        data = {**asdict(self), "samples": [{**asdict(s.work), "seconds": s.seconds} for s in self.samples]}
        path.write_text(json.dumps(data, indent=1))

    def scaled(self, factors: dict[str, float]) -> Calibration:
        """The same calibration with each step kind's time (its coefficients) times its factor (1 if absent)."""
        coefficients = {name: {feature: value * factors.get(name, 1.0) for feature, value in per.items()}
                        for name, per in self.coefficients.items()}
        return replace(self, coefficients=coefficients)

    @classmethod
    def load(cls, path: Path) -> Calibration:
        data = json.loads(path.read_text())
        data.pop("host_reference", None)  # written by profiles that timed the host-speed probe, since removed
        for points in ("idle_penalty", "decode_batch_factors", "worker_idle_penalty"):
            data[points] = tuple(tuple(point) for point in data.get(points, ()))
        samples = tuple(StepSample(StepWork(**{k: v for k, v in s.items() if k != "seconds"}), s["seconds"])
                        for s in data.pop("samples", []))
        return cls(**data, samples=samples)


def features(shape: ModelShape, work: StepWork) -> list[float]:
    return [1.0, float(work.seqs), linear_flops(shape, work), attention_flops(shape, work), step_bytes(shape, work)]


def kind(work: StepWork) -> str:
    return KINDS[0] if work.decodes_only else KINDS[1]


def fit(model: str, dtype: str, samples: list[StepSample], machine: dict[str, object] | None = None,
        idle_penalty: tuple[tuple[float, float], ...] = (), worker_hop_s: float = 0.0,
        worker_idle_penalty: tuple[tuple[float, float], ...] = (),
        co_run_slowdown: dict[str, float] | None = None) -> Calibration:
    shape = ModelShape.load(model, dtype)
    coefficients = {name: _fit_kind(shape, [s for s in samples if kind(s.work) == name], name) for name in KINDS}
    line = Calibration(model, dtype, coefficients)
    return Calibration(model, dtype, coefficients, machine or {}, tuple(samples), idle_penalty,
                       _decode_batch_factors(CalibratedTimer(line), samples), worker_hop_s, worker_idle_penalty,
                       co_run_slowdown or {})


def _decode_batch_factors(line: CalibratedTimer, samples: list[StepSample]) -> tuple[tuple[int, float], ...]:
    ratios: dict[int, list[float]] = {}
    for sample in samples:
        if kind(sample.work) == KINDS[0]:
            ratios.setdefault(sample.work.seqs, []).append(sample.seconds / line.step_time(sample.work))
    return tuple((seqs, float(np.median(r))) for seqs, r in sorted(ratios.items()) if len(r) >= MIN_BATCH_SAMPLES)


def _fit_kind(shape: ModelShape, samples: list[StepSample], name: str) -> dict[str, float]:
    if len(samples) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} {name} step samples to fit, got {len(samples)}")
    x = np.array([features(shape, s.work) for s in samples])
    y = np.array([s.seconds for s in samples])
    coefficients = _nonnegative_lstsq(x / y[:, None], np.ones(len(y)))
    return dict(zip(FEATURES, map(float, coefficients), strict=True))


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
    def __init__(self, calibration: Calibration, worker_process: bool = False) -> None:
        """worker_process: time a worker process (its idle penalty) rather than the in-process engine."""
        self.calibration = calibration
        self._idle_penalty = calibration.worker_idle_penalty if worker_process else calibration.idle_penalty
        self._shape = ModelShape.load(calibration.model, calibration.dtype)
        self._coefficients = {name: _coefficients(calibration, name) for name in KINDS}

    def step_time(self, work: StepWork) -> float:
        if not work.tokens:
            return 0.0
        step_kind = kind(work)
        seconds = sum(c * f for c, f in zip(self._coefficients[step_kind], features(self._shape, work), strict=True))
        return float(seconds * self._batch_factor(work.seqs) if step_kind == KINDS[0] else seconds)

    def co_run_factor(self, work: StepWork) -> float:
        return self.calibration.co_run_slowdown.get(kind(work), 1.0)

    def _batch_factor(self, seqs: int) -> float:
        points = self.calibration.decode_batch_factors
        if not points:
            return 1.0
        sizes, factors = zip(*points, strict=True)
        return float(np.interp(seqs, sizes, factors))

    def after_idle_s(self, idle_s: float) -> float:
        points = self._idle_penalty
        if not points or idle_s <= 0:
            return 0.0
        gaps, extras = zip(*((0.0, 0.0), *points), strict=True)
        return float(np.interp(idle_s, gaps, extras))


def _coefficients(calibration: Calibration, name: str) -> list[float]:
    fitted = calibration.coefficients.get(name)
    if not isinstance(fitted, dict) or set(fitted) != set(FEATURES):
        raise ValueError(f"the calibration has no {name} coefficients for {FEATURES} (it holds "
                         f"{sorted(calibration.coefficients)}): it was written by an older profile; rerun "
                         f"`agentserve profile`")
    return [fitted[feature] for feature in FEATURES]
