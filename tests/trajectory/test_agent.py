"""A whole agent session through trajectory/ and the real engine: delta-only prefill, masks, restore."""

from __future__ import annotations

import json
import random

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.loader import load_tokenizer
from gateway.sessions.store import RedisSessionStore, session_key
from trajectory.agent import Policies, Trajectory, TurnPlan
from trajectory.phase.classifier import Phase
from trajectory.template.default import DefaultChatTemplate
from trajectory.template.types import Message

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
WORDS = ["file", "error", "line", "ok", "click", "button", "page", "result", "the", "value", "42"]


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine("tiny", EngineSettings(num_kv_blocks=2048, block_size=16))


def observation(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def run(engine: LLMEngine, plan: TurnPlan | list[int], session: bool = True) -> Completion:
    prompt = plan if isinstance(plan, list) else plan.prompt_token_ids
    spans = [] if isinstance(plan, list) else plan.masked_spans
    request_id = engine.add_request(prompt, GREEDY, masked_spans=spans,
                                    session=plan.session if session and not isinstance(plan, list) else None)
    result = Completion(request_id)
    while engine.has_unfinished():
        for out in engine.step():
            result.add(out)
    return result


def start(session_id: str) -> Trajectory:
    return Trajectory.start(session_id, DefaultChatTemplate(), load_tokenizer(None), policies=Policies.load())


def test_twenty_turn_agent_prefills_only_deltas_and_matches_a_cold_run(engine: LLMEngine) -> None:
    trajectory = start("swe-1")
    rng = random.Random(3)
    messages = [Message("system", "You are a coding agent."), Message("user", "Fix the failing test.")]
    computed, full = [], []
    previous_kv = 0
    for turn in range(20):
        plan = trajectory.add_messages(messages, now=float(turn))
        result = run(engine, plan)
        computed.append(result.num_prompt_tokens - result.num_cached_tokens)
        full.append(len(plan.prompt_token_ids))
        assert result.num_cached_tokens == previous_kv
        previous_kv = len(plan.prompt_token_ids) + len(result.token_ids) - 1
        trajectory.record_reply(result.token_ids, now=turn + 0.5)
        messages = [Message("tool", observation(rng, rng.randrange(15, 50)), tool_call_id=f"call-{turn}",
                            name="shell")]
    assert sum(full) > 10 * sum(computed)
    assert len(plan.masked_spans) > 0  # older observations are masked
    cold = LLMEngine("tiny", EngineSettings(num_kv_blocks=2048, block_size=16))
    assert run(cold, plan, session=False).token_ids == result.token_ids


def test_pruning_happens_once_on_ingest_and_is_reported() -> None:
    trajectory = start("web-1")
    trajectory.add_messages([Message("user", "Buy the cheapest mouse.")], now=0.0)
    trajectory.record_reply([100, 101], now=1.0)
    tree = "\n".join(["[12] link 'Home'"] * 30 + ["[13] button 'Add to cart'"])
    plan = trajectory.add_messages([Message("tool", tree, tool_call_id="c1", name="browser")], now=2.0)
    [report] = plan.pruning
    assert report.tokens_after < report.tokens_before
    tool_turn = trajectory.state.turns[-1]
    assert tool_turn.tool == "browser" and tool_turn.tokens_before_pruning == report.tokens_before
    assert "Add to cart" in trajectory.renderer.turns[-1].text


def test_tool_gap_drives_the_pin_ttl() -> None:
    trajectory = start("gaps")
    trajectory.add_messages([Message("user", "go")], now=0.0)
    reply = Message("assistant", "", tool_calls=[{"id": "c1", "type": "function",
                                                  "function": {"name": "shell", "arguments": "{}"}}])
    trajectory.record_reply([100], message=reply, now=1.0)
    trajectory.add_messages([Message("tool", "done", tool_call_id="c1")], now=5.0)  # a 4 s shell gap
    trajectory.record_reply([101], message=reply, now=6.0)
    settings = trajectory.policies.settings.ttl
    assert trajectory.pin_ttl(now=6.0) == pytest.approx(4.0 * settings.margin)
    trajectory.tool_call_started("shell", estimated_s=20.0, now=6.0)
    assert trajectory.pin_ttl(now=10.0) == pytest.approx(16.0 * settings.margin)


def test_phase_of_a_big_observation_is_think() -> None:
    trajectory = start("phase")
    trajectory.add_messages([Message("user", "go")], now=0.0)
    trajectory.record_reply([100, 101, 102], now=1.0)
    rng = random.Random(1)
    plan = trajectory.add_messages([Message("tool", observation(rng, 1500), tool_call_id="c")], now=2.0)
    assert plan.phase.phase is Phase.THINK


async def test_session_round_trips_through_redis_and_continues(engine: LLMEngine, redis_url: str) -> None:
    first, second = start("resume"), start("resume-control")
    store = RedisSessionStore(redis_url)
    turns = [[Message("user", "List files.")], [Message("tool", "a.py b.py", tool_call_id="c")],
             [Message("tool", "ok", tool_call_id="d")]]
    try:
        for index, messages in enumerate(turns):
            plans = [t.add_messages(messages, now=float(index)) for t in (first, second)]
            assert plans[0].prompt_token_ids == plans[1].prompt_token_ids
            result = run(engine, plans[1], session=False)
            for t in (first, second):
                t.record_reply(result.token_ids, now=index + 0.5)
            await store.put(session_key("test", "resume"), first.to_bytes(), ttl_s=60)
            data = await store.get(session_key("test", "resume"))
            assert data is not None
            first = Trajectory.restore(data, DefaultChatTemplate(), load_tokenizer(None))
        assert first.state.token_ids == second.state.token_ids
        assert json.dumps([t.__dict__ for t in first.state.turns]) == json.dumps(
            [t.__dict__ for t in second.state.turns])
    finally:
        await store.delete(session_key("test", "resume"))
        await store.close()
