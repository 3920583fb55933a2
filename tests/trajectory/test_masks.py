"""History policies of a session: `age` masks, and the `query` policy's blocks that are never skipped."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import Completion, LLMEngine
from engine.core.sampling.sampler import SamplingParams
from engine.model.loader import load_tokenizer
from engine.model.mask import QuerySelection
from trajectory.agent import Policies, Trajectory, TurnPlan
from trajectory.template.default import DefaultChatTemplate
from trajectory.template.types import Message

BLOCK = 16
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def play(turns: int, policy: str | None) -> tuple[Trajectory, list[TurnPlan]]:
    """An agent session: the task, then per turn a reply and a tool observation."""
    trajectory = Trajectory.start("s", DefaultChatTemplate(), load_tokenizer(None), policies=Policies.load())
    rng = random.Random(1)
    messages = [Message("system", "You are a coding agent."), Message("user", "Fix the failing test.")]
    plans = []
    for turn in range(turns):
        plan = trajectory.add_messages(messages, now=float(turn), history_policy=policy)
        plans.append(plan)
        trajectory.record_reply([5, 6, 7], now=turn + 0.5)
        text = " ".join(rng.choice(["file", "error", "line", "ok", "42"]) for _ in range(rng.randrange(30, 60)))
        messages = [Message("tool", text, tool_call_id=f"call-{turn}", name="shell")]
    return trajectory, plans


def run(engine: LLMEngine, plan: TurnPlan) -> Completion:
    request_id = engine.add_request(plan.prompt_token_ids, GREEDY, masked_spans=plan.masked_spans,
                                    session=plan.session, selection=plan.selection)
    result = Completion(request_id)
    while engine.has_unfinished():
        for out in engine.step():
            result.add(out)
    return result


def test_query_policy_keeps_sinks_tool_calls_headers_and_the_last_two_turns() -> None:
    trajectory, plans = play(8, "query")
    plan, state = plans[-1], trajectory.state
    selection = plan.selection
    assert selection is not None and plan.masked_spans == [] and state.masked_spans == []
    replies = [t for t in state.turns if t.role == "assistant"][:-1]  # the last reply came after the plan
    assert selection.kept_from == replies[-2].token_end  # the previous turn's observation on
    assert all((t.token_start, t.token_end) in selection.kept for t in replies)
    observations = [t for t in state.turns if t.observation]
    assert all(any(start == t.token_start for start, _ in selection.kept) for t in observations)
    kept = selection.kept_blocks(len(plan.prompt_token_ids), BLOCK)
    assert 0 in kept and (len(plan.prompt_token_ids) - 1) // BLOCK in kept
    assert set(range(selection.kept_from // BLOCK, len(plan.prompt_token_ids) // BLOCK)) <= kept


@pytest.mark.parametrize("budget", [0.1, 0.5, 0.75])
def test_a_selection_never_skips_what_it_keeps_and_reads_its_budget(budget: float) -> None:
    rng = random.Random(int(budget * 100))
    for _ in range(50):
        position = rng.randrange(40, 2000)
        kept = tuple((s, s + rng.randrange(1, 40)) for s in rng.sample(range(position), 3))
        selection = QuerySelection(budget=budget, sink_tokens=4, recent_tokens=rng.choice([0, 16, 64]), kept=kept,
                                   kept_from=rng.choice([None, position - rng.randrange(0, 40)]))
        history = position // BLOCK
        scores = [rng.random() for _ in range(history)]
        skipped = set(selection.skipped_blocks(scores, position, BLOCK))
        never = selection.kept_blocks(position + 1, BLOCK)
        assert not skipped & never
        attended = history - len(skipped)
        assert attended == max(round(budget * history), len(never & set(range(history))))
        best = sorted(set(range(history)) - never, key=lambda b: -scores[b])
        assert skipped == set(best[attended - len(never & set(range(history))):])


def test_a_policy_the_deployment_does_not_offer_is_refused() -> None:
    with pytest.raises(ValueError, match="not offered"):
        play(1, "newest")


@pytest.mark.parametrize("policy", ["query", "attention"])
def test_query_policy_turns_reuse_the_session_kv(policy: str) -> None:
    """Each turn prefills only its delta: the session's pinned KV, decoded under the engine's picks, is reused."""
    engine = LLMEngine("tiny", EngineSettings(num_kv_blocks=1024, block_size=BLOCK))
    trajectory = Trajectory.start("s", DefaultChatTemplate(), load_tokenizer(None), policies=Policies.load())
    messages = [Message("system", "You are a coding agent."), Message("user", "Fix the failing test.")]
    held = 0
    for turn in range(6):
        plan = trajectory.add_messages(messages, now=float(turn), history_policy=policy)
        assert plan.selection is not None and plan.selection.policy == policy
        result = run(engine, plan)
        assert result.num_cached_tokens == held
        held = len(plan.prompt_token_ids) + len(result.token_ids) - 1
        trajectory.record_reply(result.token_ids, now=turn + 0.5)
        messages = [Message("tool", "error line 42 " * 20, tool_call_id=f"call-{turn}", name="shell")]
    assert len(engine.runner.summaries) == 0
