"""Queue policies on hand-built queues, through the real scheduler and block manager, and on the tiny model."""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.queue_policy import FcfsPolicy, PolicyName, QueuePolicy, SloPolicy
from engine.core.sampling.sampler import RequestError, SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SessionRef
from engine.core.slo import Fairness, SloClass, SloConfig, load_slo_config
from engine.kv_cache.manager import KVCacheManager

CONFIG = SloConfig(
    default_class="normal",
    classes={"vip": SloClass(ttft_s=1.0, tpot_s=0.05, vip=True), "interactive": SloClass(ttft_s=1.0, tpot_s=0.1),
             "normal": SloClass(ttft_s=5.0, tpot_s=0.2), "batch": SloClass(ttft_s=60.0, tpot_s=1.0)},
    fairness=Fairness(quantum_tokens=100, max_level=4, half_life_s=10.0, max_sessions=2),
)


def seq(name: str, arrival: float = 0.0, slo_class: str | None = None, session: SessionRef | None = None,
        max_tokens: int = 16, prompt_len: int = 4) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, slo_class=slo_class)
    return Sequence(name, list(range(1, prompt_len + 1)), params, arrival_time=arrival, session=session)


def waiting_order(policy: QueuePolicy, seqs: list[Sequence], now: float = 10.0) -> list[str]:
    waiting = deque(seqs)
    policy.order_waiting(waiting, now)
    return [s.request_id for s in waiting]


def test_waiting_queue_goes_by_ttft_deadline() -> None:
    seqs = [seq("batch", 0.0, "batch"), seq("normal", 1.0), seq("chat", 2.0, "interactive"),
            seq("normal-late", 3.0, "normal")]
    assert waiting_order(SloPolicy(CONFIG), seqs) == ["chat", "normal", "normal-late", "batch"]


def test_vip_goes_first_whatever_its_deadline() -> None:
    seqs = [seq("chat", 0.0, "interactive"), seq("vip-key", 50.0, "vip"),
            seq("vip-session", 40.0, "batch", SessionRef("s", ttl_s=1.0, vip=True))]
    assert waiting_order(SloPolicy(CONFIG), seqs) == ["vip-key", "vip-session", "chat"]  # VIPs: by deadline


def test_fcfs_leaves_both_queues_in_arrival_order() -> None:
    seqs = [seq("batch", 0.0, "batch"), seq("vip", 1.0, "vip"), seq("chat", 2.0, "interactive")]
    assert waiting_order(FcfsPolicy(), seqs) == ["batch", "vip", "chat"]
    running = list(seqs)
    FcfsPolicy().order_running(running)
    assert running == seqs


def test_running_queue_decodes_first_then_vip_first_then_fewest_remaining_steps() -> None:
    long, short, vip = seq("long", max_tokens=40), seq("short", max_tokens=40), seq("vip", 0, "vip")
    prefilling, vip_prefilling = seq("prefilling", max_tokens=2, prompt_len=64), seq("vip-prefilling", 0, "vip")
    for s, generated in ((long, 2), (short, 35), (vip, 1)):
        s.output_token_ids = [7] * generated
        s.num_computed_tokens = s.num_tokens - 1  # decoding: one token to compute
    prefilling.num_computed_tokens = 32
    running = [long, prefilling, vip_prefilling, short, vip]
    SloPolicy(CONFIG).order_running(running)
    assert [s.request_id for s in running] == ["vip", "short", "long", "vip-prefilling", "prefilling"]


def test_least_attained_session_goes_first_and_service_decays() -> None:
    policy = SloPolicy(CONFIG)
    heavy, light = SessionRef("heavy", ttl_s=1.0), SessionRef("light", ttl_s=1.0)
    policy.served(seq("earlier-turn", session=heavy), 700, now=0.0)  # 7 quanta: level 3
    seqs = [seq("heavy", 0.0, session=heavy), seq("light", 1.0, session=light), seq("no-session", 2.0)]
    assert waiting_order(policy, seqs, now=0.0) == ["light", "no-session", "heavy"]
    assert policy.sessions.level("heavy", 0.0) == 3
    assert waiting_order(policy, seqs, now=100.0) == ["heavy", "light", "no-session"]  # 10 half-lives later


def test_session_fairness_reorders_within_a_class_only_and_boundedly() -> None:
    policy = SloPolicy(CONFIG)
    heavy, light = SessionRef("heavy", ttl_s=1.0), SessionRef("light", ttl_s=1.0)
    seqs = [seq("heavy", 0.0, session=heavy), seq("light", 0.5, session=light), seq("chat", 3.0, "interactive"),
            seq("batch", 0.0, "batch")]
    assert waiting_order(policy, seqs, now=0.0) == ["chat", "heavy", "light", "batch"]
    policy.served(seq("earlier-turn", session=heavy), 700, now=0.0)
    assert waiting_order(policy, seqs, now=0.0) == ["chat", "light", "heavy", "batch"]
    # heavy (level 3) yields to later light turns only while they are due within 3 more TTFTs of its own
    assert waiting_order(policy, [seq("later", 14.0, session=light), seqs[0]], now=0.0) == ["later", "heavy"]
    assert waiting_order(policy, [seq("too-late", 16.0, session=light), seqs[0]], now=0.0) == ["heavy", "too-late"]


def test_session_service_is_bounded() -> None:
    policy = SloPolicy(CONFIG)
    for index, tokens in enumerate((500, 10, 300)):
        policy.served(seq(f"r{index}", session=SessionRef(f"s{index}", 1.0)), tokens, now=0.0)
    assert policy.sessions.tokens("s1", 0.0) == 0.0  # the least served of three was forgotten (max_sessions=2)
    assert policy.sessions.tokens("s0", 0.0) == 500.0
    assert policy.sessions.tokens("s0", 10.0) == pytest.approx(250.0)


def admitted(policy: QueuePolicy, max_num_seqs: int = 1) -> list[str]:
    scheduler = Scheduler(KVCacheManager(num_blocks=64, block_size=4), max_num_batched_tokens=64,
                          max_num_seqs=max_num_seqs, policy=policy)
    for s in (seq("r0", 0.0), seq("r1", 1.0), seq("chat", 2.0, "interactive"), seq("vip", 3.0, "vip")):
        scheduler.add(s)
    return [s.request_id for s in scheduler.schedule(now=3.0).seqs]


def test_scheduler_admits_by_policy_when_slots_are_scarce() -> None:
    assert admitted(FcfsPolicy()) == ["r0"]
    assert admitted(SloPolicy(CONFIG)) == ["vip"]
    assert admitted(SloPolicy(CONFIG), max_num_seqs=2) == ["vip", "chat"]


def preempted_after_two_steps(policy: QueuePolicy | None) -> list[str]:
    """Two running requests, room for only one to grow into its second block."""
    scheduler = Scheduler(KVCacheManager(num_blocks=3, block_size=4, enable_prefix_caching=False),
                          max_num_batched_tokens=64, max_num_seqs=8, policy=policy)
    scheduler.add(seq("many-left", 0.0, max_tokens=50))
    scheduler.add(seq("few-left", 1.0, max_tokens=3))
    first = scheduler.schedule()
    assert [s.request_id for s in first.seqs] == ["many-left", "few-left"]
    scheduler.update(first, {s.request_id: 9 for s in first.seqs})
    return [s.request_id for s in scheduler.schedule().preempted]


def test_preemption_victim_is_the_lowest_priority_not_the_latest() -> None:
    assert preempted_after_two_steps(None) == ["few-left"]  # FCFS: the most recently admitted
    assert preempted_after_two_steps(SloPolicy(CONFIG)) == ["many-left"]  # SLO: the most steps left


def test_shipped_config_and_unknown_class_falls_back_to_default(tmp_path: Path) -> None:
    config = load_slo_config()
    assert config.slo_class("no-such-class") == config.classes[config.default_class]
    assert config.slo_class("vip").vip and not config.slo_class(None).vip
    bad = tmp_path / "slo.yaml"
    bad.write_text("default_class: gold\nclasses: {normal: {ttft_s: 1, tpot_s: 0.1}}\n")
    with pytest.raises(ValueError, match="gold"):
        load_slo_config(bad)


def test_policy_modules_import_no_torch() -> None:
    code = ("import sys; import engine.core.queue_policy, engine.core.slo; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def first_outputs(queue_policy: PolicyName) -> list[str]:
    """Three normal requests, then a chat and a VIP one, on an engine with one sequence slot."""
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64, max_num_batched_tokens=32, max_num_seqs=1,
                                              queue_policy=queue_policy))
    for index in range(3):
        engine.add_request([5 + index] * 12, SamplingParams(max_tokens=2, temperature=0), f"normal-{index}")
    engine.add_request([9] * 12, SamplingParams(max_tokens=2, temperature=0, slo_class="interactive"), "chat")
    engine.add_request([11] * 12, SamplingParams(max_tokens=2, temperature=0, slo_class="vip"), "vip")
    with pytest.raises(RequestError, match="slo_class"):
        engine.add_request([3] * 4, SamplingParams(slo_class="gold"))
    order: list[str] = []
    while engine.has_unfinished():
        order += [out.request_id for out in engine.step() if out.finished]
    return order


def test_engine_serves_vip_then_tight_deadline_before_earlier_requests() -> None:
    assert first_outputs("fcfs") == ["normal-0", "normal-1", "normal-2", "chat", "vip"]
    assert first_outputs("slo") == ["vip", "chat", "normal-0", "normal-1", "normal-2"]
