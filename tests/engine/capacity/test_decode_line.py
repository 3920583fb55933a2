"""Decode demand from the step's line against its batch: t(b) = base + per_stream x b, fitted from decode-only
steps (`engine.core.stats.DecodeLine`), decides how many workers a number of streams needs."""

from __future__ import annotations

import random

import pytest

from engine.capacity.policy import CapacityPolicy, decode_workers, demand
from engine.capacity.settings import CapacitySettings
from engine.capacity.signals import DECODE, PREFILL, AdmittedWork, LoadSnapshot, WorkerLoad
from engine.core.stats import DecodeLine, EngineStats, StepTimer, mean_line

SETTINGS = CapacitySettings(demand_smoothing_s=0, hold_s=0)  # target_tpot_s 0.05


def test_the_fit_recovers_a_noisy_line_and_forgets_an_old_one() -> None:
    line, rng = DecodeLine(), random.Random(0)
    for _ in range(400):
        batch = rng.randint(1, 16)
        line.observe(batch, 0.010 + 0.003 * batch + rng.gauss(0, 0.001))
    base, per_stream = line.line() or (0.0, 0.0)
    assert base == pytest.approx(0.010, abs=0.002) and per_stream == pytest.approx(0.003, rel=0.1)
    for _ in range(400):  # the host slowed: the line follows within its memory
        batch = rng.randint(1, 16)
        line.observe(batch, 0.020 + 0.006 * batch)
    base, per_stream = line.line() or (0.0, 0.0)
    assert base == pytest.approx(0.020, rel=0.02) and per_stream == pytest.approx(0.006, rel=0.02)


def test_no_line_until_the_batches_vary_and_none_below_zero() -> None:
    line = DecodeLine()
    assert line.line() is None
    for _ in range(50):
        line.observe(4, 0.02)
    assert line.line() is None  # one batch size says nothing of the slope
    for batch in (1, 8) * 200:
        line.observe(batch, 0.02 - 0.001 * batch)  # noise can slope the wrong way
    base, per_stream = line.line() or (-1.0, -1.0)
    assert per_stream == 0.0 and base == pytest.approx(0.02 - 0.001 * 4.5, rel=0.05)


def test_the_step_timer_fits_decode_steps_only_and_engine_stats_average_the_lines() -> None:
    timer = StepTimer()
    for batch in (1, 5) * 40:
        timer.observe(0.01 + 0.002 * batch, 0, batch)
        timer.observe(0.5, 2048, batch)  # a prefill step: its rate, not the decode line
    base, per_stream = timer.decode_line.line() or (0.0, 0.0)
    assert base == pytest.approx(0.01) and per_stream == pytest.approx(0.002)
    assert timer.prefill_tokens_per_s == pytest.approx(4096.0)
    total = EngineStats.total([EngineStats(decode_line=(0.01, 0.002)), EngineStats(), EngineStats(
        decode_line=(0.03, 0.004))], {})
    assert total.decode_line == pytest.approx((0.02, 0.003))
    assert mean_line([None, None]) is None


def test_the_step_timer_fits_what_prompt_tokens_add_to_a_decoding_step() -> None:
    """Steps of 10 ms + 2 ms a stream, plus 0.5 ms a prompt token when they also prefill: the stall rate is
    2,000 tokens/s whatever the chunk, while the throughput (prompt tokens over the whole step) counts the streams'
    share as prefill and reads lower, the lower the smaller the chunks. A prefill-only step holds no stream and
    is left out of the stall fit."""
    timer, rng = StepTimer(), random.Random(1)
    assert timer.prefill_stall_tokens_per_s == 0.0
    for _ in range(300):
        streams, chunk = rng.randint(1, 8), rng.choice([16, 64, 256])
        timer.observe(0.010 + 0.002 * streams, 0, streams)
        timer.observe(0.010 + 0.002 * streams + 0.0005 * chunk + rng.gauss(0, 0.0005), chunk, streams)
    assert timer.prefill_stall_tokens_per_s == pytest.approx(2000.0, rel=0.05)
    assert timer.prefill_tokens_per_s < 1500.0
    timer.observe(100.0, 1000, 0)  # prefill only, however slow
    assert timer.prefill_stall_tokens_per_s == pytest.approx(2000.0, rel=0.05)
    total = EngineStats.total([EngineStats(prefill_stall_tokens_per_s=1000.0), EngineStats(),
                               EngineStats(prefill_stall_tokens_per_s=3000.0)], {})
    assert total.prefill_stall_tokens_per_s == 2000.0


def test_streams_need_workers_by_the_line_and_each_keeps_at_most_one_busy() -> None:
    # 10 ms + 2 ms a stream: at a 50 ms target one worker decodes 20 streams.
    assert decode_workers(20, (0.01, 0.002), 0.05) == pytest.approx(1.0)
    assert decode_workers(50, (0.01, 0.002), 0.05) == pytest.approx(2.5)
    assert decode_workers(3, (0.06, 0.001), 0.05) == 3  # the base alone misses the target: a worker each
    assert decode_workers(3, (0.0, 0.1), 0.05) == 3  # no batch makes a token cheaper than its target


def _snapshot(roles: str, streams: int, line: tuple[float, float] | None, tpot_s: float) -> LoadSnapshot:
    decode = [i for i, r in enumerate(roles) if r == "D"]
    workers = tuple(WorkerLoad(i, DECODE if r == "D" else PREFILL, 0, 0,
                               streams // len(decode) + (decode.index(i) < streams % len(decode)) if r == "D" else 0)
                    for i, r in enumerate(roles))
    admitted = AdmittedWork(decode_tokens=streams * 1000, streams=streams)
    return LoadSnapshot(10.0, workers, tpot_s=tpot_s, admitted=admitted, decode_line=line)


@pytest.mark.parametrize("roles", ["PPPD", "PPDD", "PDDD"])
def test_decode_demand_does_not_depend_on_the_split_with_the_line(roles: str) -> None:
    """30 streams on a 10 ms + 2 ms line: 1.5 workers whatever the split. The step each split measures is
    the line at its batch; a flat seconds-per-token read of it says more workers the more there are."""
    decode = roles.count("D")
    line = (0.01, 0.002)
    step = line[0] + line[1] * 30 / decode
    assert demand(_snapshot(roles, 30, line, step), SETTINGS).decode == pytest.approx(1.5)
    flat = demand(_snapshot(roles, 30, None, step), SETTINGS).decode
    assert flat == pytest.approx(step * decode / 0.05)  # 1.4 at one decode worker, 1.8 at three


def test_a_move_to_decode_is_not_reversed_when_the_step_falls() -> None:
    """One decode worker at 45 streams steps in 100 ms (twice the target): it takes one worker. After the
    move each steps in 55 ms, still over; the line asks for 2.25 workers, and the policy moves again only for
    the margin, never back."""
    policy, line = CapacityPolicy(SETTINGS), (0.01, 0.002)
    first = policy.decide(_snapshot("PPPD", 45, line, 0.01 + 0.002 * 45))
    assert first.prefill < 3 and first.demand.decode == pytest.approx(2.25)
    roles = "P" * first.prefill + "D" * (4 - first.prefill)
    after = policy.decide(_snapshot(roles, 45, line, 0.01 + 0.002 * 45 / roles.count("D")))
    assert after.prefill <= first.prefill and after.demand.decode == pytest.approx(2.25)
    assert "(decode step 10.0 ms + 2.00 ms a stream)" in first.reason
