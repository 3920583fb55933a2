"""Prefetch over a scripted tool gap with an injected clock: the session's KV, demoted during the gap, is
back on the device `lead_s` before the tool result is due, so the next turn loads nothing."""

from __future__ import annotations

import time
from pathlib import Path

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef
from engine.kv_cache.settings import KVCacheSettings
from engine.kv_cache.tiers.prefetch import PrefetchSchedule

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BLOCK = 4


def test_schedule_hands_a_chain_out_once_at_due_minus_lead() -> None:
    schedule = PrefetchSchedule(lead_s=0.5)
    assert not schedule.schedule("unknown", 10.0)
    schedule.remember("s", (1, 2, 3))
    assert schedule.schedule("s", result_due_at=10.0)
    assert schedule.pop_due(9.49) == []
    assert schedule.pop_due(9.5) == [(1, 2, 3)]
    assert schedule.pop_due(20.0) == []
    assert schedule.stats.scheduled == schedule.stats.started == 1


def test_remembered_sessions_are_bounded() -> None:
    schedule = PrefetchSchedule(lead_s=0.0, max_sessions=2)
    for index in range(3):
        schedule.remember(f"s{index}", (index,))
    assert list(schedule.chains) == ["s1", "s2"] and not schedule.schedule("s0", 1.0)


def run_turn(engine: LLMEngine, prompt: list[int], session: SessionRef | None) -> Completion:
    return_id = engine.add_request(prompt, GREEDY, session=session)
    result = Completion(return_id)
    while engine.has_unfinished():
        for out in engine.step():
            result.add(out)
    return result


def test_kv_demoted_during_a_tool_gap_is_promoted_before_the_result(tmp_path: Path) -> None:
    kv = KVCacheSettings(host_blocks=64, host_path=tmp_path / "host", prefetch_lead_s=0.5)
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=12, block_size=BLOCK, kv_cache=kv))
    assert engine.tiers is not None
    session = SessionRef("agent", ttl_s=0.0)  # the pin ends at once: the gap's pressure may evict it
    prompt = list(range(3, 31))
    first = run_turn(engine, prompt, session)
    chain = engine.tiers.prefetch.chains["agent"]
    run_turn(engine, list(range(500, 540)), None)  # another request during the gap fills the pool
    assert not all(block_hash in engine.kv.pool.cached for block_hash in chain)  # demoted

    now = 1000.0  # the injected clock: the tool result is due at now + 2 s
    engine.tiers.prefetch.schedule("agent", result_due_at=now + 2.0)
    assert engine.tiers.promote_due(engine.kv, now + 1.49) == 0  # too early
    promoted = engine.tiers.promote_due(engine.kv, now + 1.5)
    assert promoted > 0 and all(block_hash in engine.kv.pool.cached for block_hash in chain)

    loaded_before = engine.tiers.tiers.decision.loaded
    second = run_turn(engine, [*prompt, *first.token_ids, 7, 8], session)
    assert engine.tiers.tiers.decision.loaded == loaded_before  # the turn found its KV on the device
    assert second.num_cached_tokens == len(chain) * BLOCK


def test_set_session_ttl_schedules_the_prefetch(tmp_path: Path) -> None:
    kv = KVCacheSettings(host_blocks=8, host_path=tmp_path / "host", prefetch_lead_s=0.25, prefetch_ttl_share=0.5)
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=32, block_size=BLOCK, kv_cache=kv))
    assert engine.tiers is not None
    run_turn(engine, list(range(3, 20)), SessionRef("agent", ttl_s=30.0))
    before = time.monotonic()
    assert engine.set_session_ttl("agent", 5.0)
    due = engine.tiers.prefetch.due["agent"]
    assert before + 2.5 - 0.25 <= due <= time.monotonic() + 2.5 - 0.25  # half the TTL, less the lead
    assert engine.tiers.prefetch.pop_due(due - 0.01) == [] and engine.tiers.prefetch.pop_due(due) != []
