"""Turn-delta KV reuse through session pins: each turn computes only the tokens its KV lacks."""

from __future__ import annotations

import random

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.core.sequence import SessionRef

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def run_turn(engine: LLMEngine, prompt: list[int], session: SessionRef | None) -> Completion:
    request_id = engine.add_request(prompt, GREEDY, session=session)
    result = Completion(request_id)
    while engine.has_unfinished():
        for out in engine.step():
            result.add(out)
    return result


def test_twenty_turns_prefill_only_their_delta_and_match_a_cold_run() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=512, block_size=16))
    session = SessionRef("agent-1", ttl_s=60.0)
    rng = random.Random(0)
    history: list[int] = [1]
    computed, deltas, prompt_lengths = [], [], []
    for _ in range(20):
        observation = [rng.randrange(5, 4000) for _ in range(rng.randrange(10, 60))]
        prompt = history + observation
        prompt_lengths.append(len(prompt))
        result = run_turn(engine, prompt, session)
        # the turn's delta: its observation plus the token before it (bos, or the last sampled token)
        deltas.append(len(observation) + 1)
        computed.append(result.num_prompt_tokens - result.num_cached_tokens)
        history = prompt + result.token_ids
    assert computed == deltas
    assert sum(computed) * 8 < sum(prompt_lengths)  # full recompute would prefill every prompt whole
    assert engine.scheduler.pins.stats.adopted == 19

    cold = LLMEngine("tiny", EngineSettings(num_kv_blocks=512, block_size=16))
    final_prompt = history[: len(history) - len(result.token_ids)]
    assert run_turn(cold, final_prompt, None).token_ids == result.token_ids


def test_expired_pin_falls_back_to_the_prefix_cache() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64, block_size=8))
    session = SessionRef("agent-2", ttl_s=0.0)
    first = run_turn(engine, list(range(1, 30)), session)
    history = list(range(1, 30)) + first.token_ids
    second = run_turn(engine, [*history, 7, 8, 9], session)
    assert engine.scheduler.pins.stats.expired >= 1 and engine.scheduler.pins.stats.adopted == 0
    assert second.num_cached_tokens == (len(history) - 1) // 8 * 8  # full blocks only, found by hash


def test_pins_give_way_under_memory_pressure_but_vip_pins_stay() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=12, block_size=4, enable_prefix_caching=False))
    run_turn(engine, list(range(1, 15)), SessionRef("normal", ttl_s=600.0))
    run_turn(engine, list(range(1, 15)), SessionRef("vip", ttl_s=600.0, vip=True))
    pins = engine.scheduler.pins
    assert set(pins.pins) == {"normal", "vip"} and engine.kv.num_free_blocks == 12 - 2 * 5
    big = run_turn(engine, list(range(100, 120)), None)  # needs 7 blocks: only 2 are free
    assert big.finish_reason == "length" and len(big.token_ids) == GREEDY.max_tokens
    assert set(pins.pins) == {"vip"} and pins.stats.released_for_memory == 1


def test_changed_history_drops_the_pin() -> None:
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=64, block_size=8))
    session = SessionRef("agent-3", ttl_s=600.0)
    run_turn(engine, list(range(1, 30)), session)
    edited = run_turn(engine, list(range(2, 40)), session)  # not an extension of the pinned tokens
    assert edited.num_cached_tokens == 0 and engine.scheduler.pins.stats.adopted == 0
    assert set(engine.scheduler.pins.pins) == {"agent-3"}  # the new turn's pin
