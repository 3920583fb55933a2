"""Seeded agent workloads: exact token text, Mooncake replay, WebArena/SWE shapes, swing, truncation, context,
observations as tool output."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from agents_eval.workloads import ACT, APPEND, LAST_ACTION, THINK, Workload, coding_agent, mooncake, swe, webarena
from agents_eval.workloads.swing import Swing
from agents_eval.workloads.text import NoExactPrefixError, TokenCut, TokenText, cut_words
from agents_eval.workloads.tool_outputs import ToolOutputs
from agents_eval.workloads.types import SessionScript
from engine.model.tokenizer import HFTokenizer, Tokenizer
from trajectory.pruning.prune import OBSERVATION_ROLE, PruningConfig, prune
from trajectory.template.default import DefaultChatTemplate, Message

TINY_CONTEXT = 2048


@pytest.fixture(scope="module")
def text() -> TokenText:
    return TokenText.builtin(seed=0)


@pytest.fixture(scope="module")
def tokenizer(text: TokenText) -> Tokenizer:
    return text.tokenizer


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    lines = [json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})
             for ts, inp, out, ids in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def turn_texts(workload: Workload) -> list[str]:
    return [turn.new_messages[-1]["content"] for session in workload.sessions for turn in session.turns]


# -- exact token text


def test_blocks_encode_to_exactly_their_length_and_concatenate_aligned(text: TokenText, tokenizer: Tokenizer) -> None:
    blocks = [text.block(("k", n), n) for n in (1, 2, 7, 128, 512)]
    for block, n in zip(blocks, (1, 2, 7, 128, 512), strict=True):
        assert len(tokenizer.encode(block)) == n
    assert tokenizer.encode("".join(blocks)) == [t for block in blocks for t in tokenizer.encode(block)]


def test_equal_keys_give_identical_blocks_and_a_block_prefix_is_its_shorter_self(text: TokenText) -> None:
    assert text.block(42, 64) == text.block(42, 64)
    assert text.block(42, 64) != text.block(43, 64)
    assert text.block(42, 64) != text.with_seed(1).block(42, 64)
    assert text.block(42, 64).startswith(text.block(42, 20))
    assert cut_words(text.block(42, 64), 20) == text.block(42, 20)


def test_new_tokens_is_the_encoded_length_of_the_new_content(text: TokenText, tokenizer: Tokenizer) -> None:
    for build in (mooncake.build, webarena.build, swe.build):
        workload = build(seed=3, max_requests=40, tokenizer=text)
        session = workload.sessions[0]
        assert len(tokenizer.encode(session.system)) == session.system_tokens
        for turn in (t for s in workload.sessions[:5] for t in s.turns):
            assert sum(len(tokenizer.encode(m["content"])) for m in turn.new_messages) == turn.new_tokens


# -- Mooncake replay


def test_replay_is_deterministic_by_seed(text: TokenText) -> None:
    first = mooncake.build(seed=1, max_requests=120, tokenizer=text)
    assert first == mooncake.build(seed=1, max_requests=120, tokenizer=text)
    other = mooncake.build(seed=2, max_requests=120, tokenizer=text)
    assert [len(s.turns) for s in other.sessions] == [len(s.turns) for s in first.sessions]
    assert turn_texts(other) != turn_texts(first)
    json.dumps(first.settings)


def test_session_grouping_of_a_small_trace(tmp_path: Path, text: TokenText) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [
        (0, 1200, 96, [0, 1, 2]),
        (1000, 1000, 48, [0, 3]),  # shares only the common first block: a session of its own
        (2000, 1400, 96, [0, 1, 4]),  # continues request 0 (its partial last block renamed)
        (3000, 2104, 96, [0, 1, 4, 5, 6]),  # continues request 2
        (4000, 1300, 96, [0, 1, 2, 7]),  # branches off request 0, not extending request 3: its own session
    ])
    workload = mooncake.build(trace=trace, seed=0, length_scale=1 / 8, time_scale=0.5, tokenizer=text,
                              max_model_len=None, max_requests=None)
    assert [len(s.turns) for s in workload.sessions] == [3, 1, 1]
    assert [s.start_s for s in workload.sessions] == [0.0, 0.5, 2.0]
    conversation = workload.sessions[0]
    assert [t.at_s for t in conversation.turns] == [0.0, 1.0, 1.5]
    assert [t.new_tokens for t in conversation.turns] == [150, 175 - 150 - 12, 263 - 175 - 12]
    assert [t.max_output_tokens for t in conversation.turns] == [12, 12, 12]
    assert [t.phase for t in conversation.turns] == [THINK, ACT, THINK]
    assert all(t.history == APPEND for t in conversation.turns)
    assert workload.settings["trace_sessions"] == 3


def test_equal_hash_ids_give_identical_token_blocks(tmp_path: Path, text: TokenText, tokenizer: Tokenizer) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", [
        (0, 1500, 8, [0, 1, 2]),  # 375 tokens at scale 1/4: blocks of 128, 128 and 119
        (10, 1500, 8, [0, 3, 4]),
        (20, 1500, 8, [9, 1, 2]),
        (30, 1900, 8, [0, 1, 8, 6]),  # continues the first: 475 - 375 - 2 = 98 new tokens, from block 8
        (40, 1500, 8, [0, 8, 10]),
    ])
    workload = mooncake.build(trace=trace, length_scale=1 / 4, tokenizer=text, max_requests=None)
    first, later, second, third, fourth = (tokenizer.encode(content) for content in turn_texts(workload))
    block = 128
    assert len(first) == len(second) == len(third) == len(fourth) == 375 and len(later) == 98
    assert first[:block] == second[:block] == fourth[:block] and first[block:] != second[block:]
    assert first[:block] != third[:block] and first[block:] == third[block:]
    assert later == fourth[block: block + 98]


def test_rate_sets_the_time_scale(text: TokenText) -> None:
    workload = mooncake.build(rate=2.0, max_requests=300, tokenizer=text)
    starts = [s.start_s for s in workload.sessions]
    assert len(starts) / (starts[-1] - starts[0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        mooncake.build(rate=2.0, time_scale=2.0, tokenizer=text)


# -- generated shapes


@pytest.fixture(scope="module")
def webarena_sample(text: TokenText) -> Workload:
    return webarena.build(seed=7, rate=4.0, duration_s=150.0, max_requests=None, length_scale=0.1, tokenizer=text,
                          max_model_len=None)


@pytest.fixture(scope="module")
def swe_sample(text: TokenText) -> Workload:
    return swe.build(seed=7, rate=4.0, duration_s=150.0, max_requests=None, length_scale=0.02, tokenizer=text,
                     max_model_len=None)


def test_webarena_shape(webarena_sample: Workload) -> None:
    sessions, turns = webarena_sample.sessions, [t for s in webarena_sample.sessions for t in s.turns]
    assert len(sessions) > 500
    assert {s.system for s in sessions} == {sessions[0].system} and sessions[0].system_tokens == round(1024 * 0.1)
    assert all(2 <= len(s.turns) <= 30 for s in sessions)
    assert 9.5 < statistics.mean(len(s.turns) for s in sessions) < 12.5
    assert max(t.new_tokens for t in turns) <= round(1920 * 0.1)
    assert max(t.max_output_tokens for t in turns) <= round(384 * 0.1)
    assert {t.history for t in turns} == {LAST_ACTION}
    assert all(s.prompt_tokens()[i] == s.system_tokens + (s.turns[i - 1].max_output_tokens if i else 0)
               + t.new_tokens for s in sessions for i, t in enumerate(s.turns))


def test_swe_shape(swe_sample: Workload) -> None:
    sessions, turns = swe_sample.sessions, [t for s in swe_sample.sessions for t in s.turns]
    assert 16.5 < statistics.mean(len(s.turns) for s in sessions) < 19.5
    assert 26 < statistics.mean(t.max_output_tokens for t in turns) < 34
    assert {t.history for t in turns} == {APPEND}
    think = statistics.mean(t.new_tokens for t in turns if t.phase == THINK)
    assert 2400 * 0.02 < think < 3200 * 0.02
    prompts = swe_sample.sessions[0].prompt_tokens()
    assert prompts == sorted(prompts)


def test_coding_agent_shape(text: TokenText) -> None:
    """The Copilot coding-agent card's shape, before any context cut: ~3.95 user requests a session, ~7.8 calls
    each, every call after a request answering the previous reply's call; follow-ups wait on a person (a longer
    gap than a tool's); histories append; prompt tokens far outnumber completion tokens."""
    workload = coding_agent.build(seed=4, rate=2.0, duration_s=200.0, max_requests=None, tokenizer=text,
                                  max_model_len=None, length_scale=0.1)
    sessions = workload.sessions
    requests = [[i for i, t in enumerate(s.turns) if t.new_messages[0]["role"] == "user"] for s in sessions]
    assert len(sessions) > 300 and all(steps[0] == 0 for steps in requests)
    assert 3.5 < statistics.mean(len(steps) for steps in requests) < 4.4
    assert 7.0 < sum(len(s.turns) for s in sessions) / sum(len(steps) for steps in requests) < 8.6
    for session, steps in zip(sessions, requests, strict=True):
        for step, turn in enumerate(session.turns):
            if step not in steps:
                assert turn.new_messages[0]["tool_call_id"] == f"call_{step - 1}"
    user_gaps = [s.turns[i].tool_gap_s for s, steps in zip(sessions, requests, strict=True) for i in steps[1:]]
    tool_gaps = [t.tool_gap_s for s, steps in zip(sessions, requests, strict=True)
                 for i, t in enumerate(s.turns) if i not in steps]
    assert statistics.median(user_gaps) > 4 * statistics.median(tool_gaps)
    assert {t.history for s in sessions for t in s.turns} == {APPEND}
    full = coding_agent.build(seed=4, tokenizer=text, max_requests=None, max_model_len=None, length_scale=1.0)
    prompt = sum(sum(s.prompt_tokens()) for s in full.sessions)
    assert prompt > 80 * sum(t.max_output_tokens for s in full.sessions for t in s.turns)
    assert coding_agent.build(seed=4, tokenizer=text, max_model_len=2048).settings["length_scale"] == 0.25


def test_tool_gaps_are_heavy_tailed_and_scale_with_time(text: TokenText, swe_sample: Workload) -> None:
    gaps = sorted(t.tool_gap_s for s in swe_sample.sessions for t in s.turns[1:])
    median, p99 = gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.99)]
    assert p99 / median > 10 and statistics.mean(gaps) > 1.5 * median
    assert max(gaps) <= 60.0 and min(t.tool_gap_s for s in swe_sample.sessions for t in s.turns[:1]) == 0.0
    slow = swe.build(seed=7, rate=4.0, duration_s=50.0, max_requests=None, length_scale=0.02, tokenizer=text,
                     max_model_len=None, time_scale=3.0)
    slow_gaps = sorted(t.tool_gap_s for s in slow.sessions for t in s.turns[1:])
    assert 2.0 < slow_gaps[len(slow_gaps) // 2] / median < 4.5 and max(slow_gaps) <= 180.0


@pytest.mark.parametrize("sample", ["webarena_sample", "swe_sample"])
def test_swing_alternates_think_and_act_heavy_windows(sample: str, request: pytest.FixtureRequest) -> None:
    workload: Workload = request.getfixturevalue(sample)
    swing = Swing()
    by_window: dict[str, list[bool]] = {THINK: [], ACT: []}
    for session in workload.sessions:
        for turn in session.turns:
            assert turn.planned_at_s is not None
            by_window[swing.window_phase(turn.planned_at_s)].append(turn.phase == THINK)
    assert statistics.mean(by_window[THINK]) >= 0.7
    assert statistics.mean(by_window[ACT]) <= 0.3
    windows = workload.settings["swing"]["windows"]  # type: ignore[index]
    assert [w["phase"] for w in windows[:3]] == [THINK, ACT, THINK]


def test_phase_decides_sizes(webarena_sample: Workload) -> None:
    turns = [t for s in webarena_sample.sessions for t in s.turns]
    think = [t for t in turns if t.phase == THINK]
    act = [t for t in turns if t.phase == ACT]
    assert min(t.new_tokens for t in think) > max(t.new_tokens for t in act)
    assert max(t.max_output_tokens for t in think) < min(t.max_output_tokens for t in act)


@pytest.mark.parametrize(("build", "tool"), [(swe.build, "shell"), (webarena.build, "browser")])
def test_synthetic_agents_speak_function_calling_by_default(build: Callable[..., Workload], tool: str,
                                                            text: TokenText) -> None:
    workload = build(seed=3, tokenizer=text, max_requests=60)
    assert workload.settings["observations"] == "tool"
    for session in workload.sessions:
        roles = [m["role"] for t in session.turns for m in t.new_messages]
        assert roles == ["user"] + ["tool"] * (len(roles) - 1)
        for step, turn in enumerate(session.turns[1:]):
            [message] = turn.new_messages
            assert message["tool_call_id"] == f"call_{step}" and message["name"] == tool
        assert {t.tools[0]["function"]["name"] for t in session.turns} == {tool}
    as_user = build(seed=3, tokenizer=text, max_requests=60, observations="user")
    assert {m["role"] for s in as_user.sessions for t in s.turns for m in t.new_messages} == {"user"}
    assert all(t.tools == () for s in as_user.sessions for t in s.turns)
    assert turn_texts(as_user)[:3] == turn_texts(workload)[:3]
    with pytest.raises(ValueError, match="observations must be"):
        build(seed=3, tokenizer=text, observations="assistant")


def test_generated_workloads_are_deterministic_by_seed(text: TokenText) -> None:
    for build in (webarena.build, swe.build, coding_agent.build):
        first = build(seed=5, tokenizer=text)
        assert first == build(seed=5, tokenizer=text)
        assert turn_texts(first) != turn_texts(build(seed=6, tokenizer=text))
        assert [s.start_s for s in first.sessions] == sorted(s.start_s for s in first.sessions)
        json.dumps(first.settings)  # the report embeds it


# -- truncation and context


def test_truncate_keeps_the_earliest_turns_as_session_prefixes(webarena_sample: Workload) -> None:
    cut = webarena_sample.truncate(max_requests=300)
    assert cut.num_requests == 300
    full = {s.session_id: s for s in webarena_sample.sessions}
    for session in cut.sessions:
        assert session.turns == full[session.session_id].turns[: len(session.turns)]
    kept = max(t for s in cut.sessions for t in s.planned_times())
    dropped = [t for s in webarena_sample.sessions for t in s.planned_times()[len(_turns_of(cut, s)):]]
    assert kept <= min(dropped)
    assert cut.settings["truncated"] == {"max_requests": 300, "duration_s": None}


def _turns_of(workload: Workload, session: SessionScript) -> tuple[object, ...]:
    return next((s.turns for s in workload.sessions if s.session_id == session.session_id), ())


def test_truncate_by_duration_bounds_open_loop_arrivals(text: TokenText) -> None:
    replay = mooncake.build(max_requests=300, tokenizer=text)
    cut = replay.truncate(duration_s=30.0)
    assert 0 < cut.num_requests < replay.num_requests
    assert all(t.at_s is not None and t.at_s < 30.0 for s in cut.sessions for t in s.turns)
    assert mooncake.build(max_requests=300, tokenizer=text, duration_s=30.0).sessions == cut.sessions
    generated = webarena.build(seed=1, tokenizer=text, max_requests=None)
    assert all(s.start_s < 20.0 for s in generated.truncate(duration_s=20.0).sessions)


@pytest.mark.parametrize(("build", "options"), [(mooncake.build, {}), (webarena.build, {"rate": 1.0}),
                                                (swe.build, {"rate": 1.0}),
                                                (swe.build, {"rate": 1.0, "observations": "user"}),
                                                (coding_agent.build, {"rate": 0.5, "max_model_len": 2048})])
def test_every_request_fits_the_model_context(build: Callable[..., Workload], options: dict[str, object],
                                              text: TokenText, tokenizer: Tokenizer) -> None:
    workload = build(seed=2, tokenizer=text, max_requests=120, **options)
    assert workload.num_requests == 120
    for session in workload.sessions:
        for prompt, output_tokens in _rendered_requests(session, text):
            assert len(tokenizer.encode(prompt, add_bos=True)) + output_tokens <= TINY_CONTEXT


def _rendered_requests(session: SessionScript, text: TokenText) -> list[tuple[str, int]]:
    """Each request's prompt as the gateway renders it, earlier replies standing in as exact-length text."""
    template = DefaultChatTemplate()
    system = [Message("system", session.system)] if session.system else []
    history: list[Message] = []
    requests = []
    for index, turn in enumerate(session.turns):
        new = [Message.from_openai(m) for m in turn.new_messages]
        requests.append((template.render(system + history + new, list(turn.tools) or None,
                                          add_generation_prompt=True), turn.max_output_tokens))
        reply = Message("assistant", text.block(("reply", index), turn.max_output_tokens))
        history = [*history, *new, reply] if turn.history == APPEND else [reply]
    return requests


# -- observations: tool output, exact in tokens, with something to prune


@pytest.mark.parametrize(("build", "tool", "opening"), [(swe.build, "shell", "$ "),
                                                        (webarena.build, "browser", "RootWebArea '")])
def test_observations_are_tool_output_that_pruning_shortens(build: Callable[..., Workload], tool: str, opening: str,
                                                             text: TokenText, tokenizer: Tokenizer) -> None:
    workload = build(seed=3, tokenizer=text, max_requests=120)
    observations = [m for s in workload.sessions for t in s.turns for m in t.new_messages if m["role"] == "tool"]
    assert len(observations) > 60
    assert all(m["content"].startswith(opening) or opening.startswith(m["content"]) for m in observations)
    config = PruningConfig.load()
    results = [prune(m["content"], OBSERVATION_ROLE, m["name"], config, lambda s: len(tokenizer.encode(s)))
               for m in observations]
    before, after = sum(r.tokens_before for r in results), sum(r.tokens_after for r in results)
    assert before == sum(t.new_tokens for s in workload.sessions for t in s.turns[1:])
    assert after < before * 0.99  # pruning engages: whitespace, punctuation runs, repeated lines


def toy_bpe() -> HFTokenizer:
    """A real byte-level BPE whose one merge is newline + tab: a prefix ending in it counts one token that the
    next character splits in two, so the count jumps from n - 1 to n + 1 (as SmolLM2's does on trees)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merged = "\u010a\u0109"  # "\n\t" in byte-level characters
    vocab = {piece: index for index, piece in enumerate([*alphabet, merged])}
    bpe = tokenizers.Tokenizer(models.BPE(vocab, [("\u010a", "\u0109")]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return HFTokenizer(bpe, None, None)


def test_token_cut_is_exact_or_says_no_prefix_is() -> None:
    cutter = TokenCut(toy_bpe())
    assert [cutter.count("x\n\t[1]"[:end]) for end in range(1, 5)] == [1, 2, 2, 4]
    assert cutter.cut("x\n\t[1]", 4) == "x\n\t[" and cutter.cut("x\n\t[1]", 2) in ("x\n", "x\n\t")
    with pytest.raises(NoExactPrefixError):
        cutter.cut("x\n\t[1]", 3)
    with pytest.raises(ValueError, match="fewer than"):
        cutter.cut("x", 2)


def test_tool_outputs_are_exact_where_some_counts_cannot_be_cut_to() -> None:
    tokenizer = toy_bpe()
    outputs = ToolOutputs(tokenizer, seed=1)
    for n in (1, 7, 40, 75, 131, 260, 480):
        for tool in ("shell", "browser"):
            content = outputs.text(tool, ("key", n), n)
            assert len(tokenizer.encode(content)) == n and content == outputs.text(tool, ("key", n), n)
    with pytest.raises(ValueError, match="no observations for tool"):
        outputs.text("fax", "key", 10)
