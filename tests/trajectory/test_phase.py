"""Think/act classification, the global mix, and shift detection on simulated agent traffic."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trajectory.phase.classifier import Phase, PhaseConfig, PhaseEstimate, PhaseShiftEvent, TurnFeatures, classify_turn
from trajectory.phase.monitor import PhaseMixMonitor

CONFIG = PhaseConfig.load()
PREFILL_TOKENS_PER_S = 20_000.0
DECODE_S_PER_TOKEN = 0.005


@dataclass(frozen=True)
class Traffic:
    """Sessions whose turn starts are `gap_s` apart (uniform); each turn is think with the segment's share."""

    segments: tuple[tuple[float, float], ...]  # (duration_s, think share)
    sessions: int = 64
    gap_s: tuple[float, float] = (0.2, 2.0)

    def think_share_at(self, t: float) -> float:
        end = 0.0
        for duration, share in self.segments:
            end += duration
            if t < end:
                return share
        return self.segments[-1][1]

    @property
    def switch_times(self) -> list[float]:
        ends = itertools.accumulate(duration for duration, _ in self.segments)
        return [end for end, (_, before), (_, after) in zip(ends, self.segments, self.segments[1:], strict=False)
                if before != after]

    @property
    def duration(self) -> float:
        return sum(d for d, _ in self.segments)


@dataclass
class Run:
    monitor: PhaseMixMonitor
    now: float = 0.0
    turn_times: list[float] = field(default_factory=list)
    think_shares: list[float] = field(default_factory=list)

    def first_turn_after(self, t: float) -> float:
        return min(x for x in self.turn_times if x >= t)


def turn_features(think: bool, outputs: list[int], rng: random.Random) -> TurnFeatures:
    if think:
        delta = int(rng.lognormvariate(math.log(3000), 0.5))
        return TurnFeatures(delta, tuple(outputs[-4:]), True, ("tool",), True)
    delta = int(rng.lognormvariate(math.log(30), 0.5))
    role = "user" if rng.random() < 0.2 else "tool"
    return TurnFeatures(delta, tuple(outputs[-4:]), role == "tool", (role,), True)


def play_turn(run: Run, traffic: Traffic, session: int, outputs: list[int], rng: random.Random,
              config: PhaseConfig) -> list[tuple[float, str]]:
    """Classify and observe one turn at `run.now`; returns its decode start and end and the next turn."""
    now, sid = run.now, f"s{session}"
    think = rng.random() < traffic.think_share_at(now)
    features = turn_features(think, outputs, rng)
    run.monitor.observe_turn(sid, classify_turn(features, config), features.delta_tokens, now)
    run.turn_times.append(now)
    run.think_shares.append(run.monitor.mix(now).think_share)
    outputs.append(int(rng.lognormvariate(math.log(150 if think else 20), 0.4)))
    start = now + features.delta_tokens / PREFILL_TOKENS_PER_S
    end = start + outputs[-1] * DECODE_S_PER_TOKEN
    return [(start, "start"), (end, "end"), (now + rng.uniform(*traffic.gap_s), "turn")]


def simulate(traffic: Traffic, seed: int, config: PhaseConfig = CONFIG) -> Run:
    """Event-driven replay: turn arrivals, then each turn's decode start and end, in time order."""
    rng = random.Random(seed)
    run = Run(PhaseMixMonitor(config, clock=lambda: pytest.fail("the simulation passes explicit times")))
    decode_hooks = {"start": run.monitor.decode_started, "end": run.monitor.decode_finished}
    queue = [(rng.uniform(0, traffic.gap_s[1]), session, "turn", session) for session in range(traffic.sessions)]
    heapq.heapify(queue)
    outputs: dict[int, list[int]] = {session: [] for session in range(traffic.sessions)}
    order = itertools.count(traffic.sessions)
    while queue:
        run.now, _, kind, session = heapq.heappop(queue)
        if kind in decode_hooks:
            decode_hooks[kind](f"s{session}", run.now)
        elif run.now < traffic.duration:
            for when, what in play_turn(run, traffic, session, outputs[session], rng, config):
                heapq.heappush(queue, (when, next(order), what, session))
    return run


def swing_delays(run: Run, traffic: Traffic) -> list[float]:
    return [event.timestamp - run.first_turn_after(switch)
            for event, switch in zip(run.monitor.events, traffic.switch_times, strict=True)]


SWINGS = Traffic(((10.0, 0.8), (10.0, 0.2), (10.0, 0.8)))


# Classification


def test_large_tool_observation_is_think_with_high_confidence() -> None:
    features = TurnFeatures(delta_tokens=3000, recent_output_tokens=(), last_turn_had_tool_calls=True,
                            new_roles=("tool",), tools_available=True)
    estimate = classify_turn(features, CONFIG)
    assert estimate.phase is Phase.THINK
    assert estimate.confidence > 0.9


def test_short_user_continue_after_short_outputs_is_act() -> None:
    features = TurnFeatures(delta_tokens=20, recent_output_tokens=(15, 22, 12), last_turn_had_tool_calls=False,
                            new_roles=("user",), tools_available=True)
    estimate = classify_turn(features, CONFIG)
    assert estimate.phase is Phase.ACT
    assert estimate.confidence > 0.95


@pytest.mark.parametrize("features", [
    TurnFeatures(256, (), False, ("user",), True),
    TurnFeatures(600, (40, 35, 50), True, ("tool",), True),
])
def test_ambiguous_turn_has_confidence_near_half(features: TurnFeatures) -> None:
    assert classify_turn(features, CONFIG).confidence < 0.6


def test_classifier_accepts_its_own_section_of_the_config() -> None:
    features = TurnFeatures(3000)
    assert classify_turn(features, CONFIG.classifier) == classify_turn(features, CONFIG)


turn_features_strategy = st.builds(
    TurnFeatures,
    delta_tokens=st.integers(0, 200_000),
    recent_output_tokens=st.lists(st.integers(0, 50_000), max_size=8).map(tuple),
    last_turn_had_tool_calls=st.booleans(),
    new_roles=st.lists(st.sampled_from(["user", "tool", "system", "assistant"]), max_size=3).map(tuple),
    tools_available=st.booleans(),
)


@given(turn_features_strategy, st.integers(1, 100_000))
def test_confidence_is_bounded_and_think_grows_with_the_delta(features: TurnFeatures, extra: int) -> None:
    estimate = classify_turn(features, CONFIG)
    larger = classify_turn(TurnFeatures(features.delta_tokens + extra, features.recent_output_tokens,
                                        features.last_turn_had_tool_calls, features.new_roles,
                                        features.tools_available), CONFIG)
    assert 0.5 <= estimate.confidence <= 1.0
    assert larger.think_probability >= estimate.think_probability


# The mix


def test_mix_blends_turn_share_with_the_load_ratio() -> None:
    monitor = PhaseMixMonitor(CONFIG)
    monitor.observe_turn("a", PhaseEstimate(Phase.THINK, 0.9), 3000, now=10.1)
    monitor.observe_turn("b", PhaseEstimate(Phase.ACT, 0.8), 20, now=10.2)
    monitor.decode_started("b", now=10.3)
    sample = monitor.mix(now=10.5)
    load_share = 3020 / (3020 + CONFIG.mix.decode_stream_cost_tokens_per_s)
    weight = CONFIG.mix.load_weight
    assert sample.turns_in_window == 2
    assert sample.active_decodes == 1
    assert sample.prefill_tokens_per_s == pytest.approx(3020 / CONFIG.mix.window_s)
    assert sample.think_share == pytest.approx((1 - weight) * 0.55 + weight * load_share)
    assert monitor.mix(now=11.15).turns_in_window == 1


def test_mix_without_turns_is_the_load_ratio_or_neutral() -> None:
    monitor = PhaseMixMonitor(CONFIG)
    assert monitor.mix(now=0.0).think_share == 0.5
    monitor.decode_started("a", now=0.0)
    assert monitor.mix(now=0.0).think_share == 0.0
    monitor.decode_finished("a", now=0.1)
    monitor.decode_finished("a", now=0.2)
    assert monitor.mix(now=0.3).active_decodes == 0


def test_monitor_reads_its_clock_when_no_time_is_given() -> None:
    now = [100.0]
    monitor = PhaseMixMonitor(CONFIG, clock=lambda: now[0])
    monitor.observe_turn("a", PhaseEstimate(Phase.THINK, 1.0), 500)
    now[0] = 100.0 + CONFIG.mix.window_s
    assert monitor.mix().turns_in_window == 0


operation = st.one_of(
    st.tuples(st.just("turn"), st.sampled_from(list(Phase)), st.floats(0.5, 1.0), st.integers(0, 100_000)),
    st.tuples(st.just("start"), st.sampled_from("abc")),
    st.tuples(st.just("end"), st.sampled_from("abc")),
)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.floats(0.0, 0.5), operation), max_size=60))
def test_think_share_stays_in_unit_interval(steps: list[tuple[float, tuple]]) -> None:
    monitor = PhaseMixMonitor(CONFIG)
    now = 0.0
    for gap, (kind, *args) in steps:
        now += gap
        if kind == "turn":
            phase, confidence, tokens = args
            monitor.observe_turn("a", PhaseEstimate(phase, confidence), tokens, now)
        elif kind == "start":
            monitor.decode_started(args[0], now)
        else:
            monitor.decode_finished(args[0], now)
        assert 0.0 <= monitor.mix(now).think_share <= 1.0


# Shift detection


@pytest.mark.parametrize(("sessions", "mean_bound_s", "max_bound_s"), [(64, 0.25, 0.5), (128, 0.15, 0.4)])
def test_swings_are_detected_in_the_right_direction_and_soon(sessions: int, mean_bound_s: float,
                                                             max_bound_s: float) -> None:
    """80/20 -> 20/80 -> 80/20 at about 57 (64 sessions) and 115 (128 sessions) turns per second.

    A 0.8 -> 0.2 swing carries about 0.8 nats of evidence per turn, so at the configured false-event rate
    detection takes some 12-15 turns on average and about twice that in the tail: about 200 ms on average
    at 64 sessions, about 100 ms at 128 sessions (200 ms for nine swings in ten), not 200 ms for every swing."""
    traffic = Traffic(SWINGS.segments, sessions=sessions)
    delays = []
    for seed in range(5):
        run = simulate(traffic, seed)
        assert [event.direction for event in run.monitor.events] == ["to_act", "to_think"]
        delays += swing_delays(run, traffic)
    assert sum(delays) / len(delays) < mean_bound_s
    assert max(delays) < max_bound_s


def test_event_reports_levels_and_delay_hint() -> None:
    run = simulate(SWINGS, seed=11)
    to_act, to_think = run.monitor.events
    assert to_act.think_share_before > 0.7 > 0.3 > to_act.think_share_after
    assert to_think.think_share_before < 0.3 < 0.7 < to_think.think_share_after
    assert 0.0 < to_act.detection_delay_hint < 1.0


@pytest.mark.parametrize("seed", range(3))
def test_stationary_mix_gives_no_events(seed: int) -> None:
    run = simulate(Traffic(((60.0, 0.8),)), seed)
    assert run.monitor.events == []
    assert all(0.0 <= share <= 1.0 for share in run.think_shares)


def test_subscribers_receive_each_event_once() -> None:
    received: list[PhaseShiftEvent] = []
    rng = random.Random(3)
    monitor = PhaseMixMonitor(CONFIG)
    monitor.subscribe(received.append)
    for i in range(400):
        act = rng.random() < (0.2 if i < 200 else 0.8)
        monitor.observe_turn(f"s{i % 7}", PhaseEstimate(Phase.ACT if act else Phase.THINK, 0.95), 100, i * 0.01)
    assert received == monitor.events
    assert [e.direction for e in received] == ["to_act"]


# Settings


def test_repository_config_matches_the_defaults() -> None:
    assert PhaseConfig.load() == PhaseConfig()


def test_config_loads_from_yaml_with_partial_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "phase.yaml"
    path.write_text("classifier:\n  delta_weight: 2.0\ndetector:\n  threshold: 6.5\n")
    config = PhaseConfig.load(path)
    assert config.classifier.delta_weight == 2.0
    assert config.detector.threshold == 6.5
    assert config.mix == PhaseConfig().mix
    monkeypatch.setenv("AGENTSERVE_PHASE_CONFIG", str(path))
    assert PhaseConfig.load() == config


def test_config_rejects_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "phase.yaml"
    path.write_text("detector:\n  treshold: 6.5\n")
    with pytest.raises(ValueError, match="treshold"):
        PhaseConfig.load(path)
