"""`agentserve profile` on the tiny model, its rounds shrunk: every kind of step the swe workload makes the engine
take is sampled (fresh prompts, cached-prefix turns, a turn joining decodes, decodes), and the idle penalty has
a point per gap, the co-run slowdown has a factor per step kind, the worker hop is measured; the samples
fit. Nothing here is timed against a bound: every figure is judged by its kind and sign (a busy host makes
them larger, not different in kind), and the rounds are shrunk so the run is short on a loaded host too."""

from __future__ import annotations

import math

import pytest

from agents_eval.sim.calibration import profile
from agents_eval.sim.calibration.fit import CalibratedTimer, fit


def test_profile_samples_every_step_kind_and_the_idle_penalty(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"PROMPT_LENGTHS": (16, 128), "BATCH_SIZES": (1, 4), "CACHED_PREFIXES": (64,),
                        "TURN_DELTAS": (8,), "TURN_BATCHES": (1, 2), "DECODERS": (2,), "IDLE_GAPS_S": (0.01, 0.02),
                        "IDLE_REPEATS": 1, "IDLE_TURN": (64, 8), "CO_RUN_PAIRS": 2, "HOP_PAIRS": 2,
                        "CO_RUN_ROUNDS": ((128, 1), (16, 4))}.items():
        monkeypatch.setattr(profile, name, value)
    measured = profile.profile_engine("tiny", max_tokens=4, seed=0)
    samples, idle_penalty = measured.samples, measured.idle_penalty
    works = [s.work for s in samples]
    assert any(w.context_tokens == 0 and w.tokens == 128 * 4 for w in works)  # a fresh batch
    assert any(w.seqs == 1 and w.tokens == 8 and w.context_tokens == 64 for w in works)  # a turn on its history
    assert any(w.seqs == 3 and w.tokens == 8 + 2 for w in works)  # the turn joining two decoding requests
    assert any(w.tokens == w.seqs == 4 for w in works)  # decodes
    assert [gap for gap, _ in idle_penalty] == [0.01, 0.02] and all(extra >= 0 for _, extra in idle_penalty)
    assert 0 <= measured.worker_hop_s < math.inf  # messages over local pipes and polls (how long: the host says)
    assert [gap for gap, _ in measured.worker_idle_penalty] == [0.01, 0.02]
    assert set(measured.co_run_slowdown) == {"decode", "prefill"} and min(measured.co_run_slowdown.values()) > 0
    timer = CalibratedTimer(fit("tiny", "float32", samples, idle_penalty=idle_penalty))
    assert all(timer.step_time(w) > 0 for w in works)
