"""Structured outputs in the engine: grammar-constrained tokens on the built-in tiny model (random weights, so
only the grammar makes its output valid), against the unconstrained path on the same seeds."""

from __future__ import annotations

import json
import re

import pytest

from engine.config import EngineSettings
from engine.core.llm_engine import LLMEngine
from engine.core.sampling.constraint import GrammarSpec
from engine.core.sampling.grammar import JSON_OPTIONS, GrammarError, json_schema_spec
from engine.core.sampling.sampler import RequestError, SamplingParams

SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"},
    "tool": {"enum": ["ls", "cat", "grep"]},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
}, "required": ["ok", "tool", "n"], "additionalProperties": False}
PROMPTS = [[1, *range(30 + i, 40 + 3 * i)] for i in range(5)]


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine("tiny", EngineSettings(num_kv_blocks=256, max_num_batched_tokens=64))


def constrained(seed: int, jump_forward: bool = True, temperature: float = 0.9) -> SamplingParams:
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), jump_forward)
    return SamplingParams(max_tokens=40, temperature=temperature, seed=seed, grammar=spec)


def is_valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return set(value) == {"ok", "tool", "n"} and value["tool"] in SCHEMA["properties"]["tool"]["enum"] and \
        isinstance(value["ok"], bool) and 0 <= value["n"] <= 99


def test_constrained_output_is_always_valid_where_the_unconstrained_is_not(engine: LLMEngine) -> None:
    params = [constrained(seed) for seed in range(len(PROMPTS))]
    results = engine.generate(PROMPTS, params)
    assert all(is_valid(r.text) and r.finish_reason == "stop" for r in results), [r.text for r in results]
    free = engine.generate(PROMPTS, [SamplingParams(max_tokens=40, temperature=0.9, seed=s) for s in range(5)])
    assert not any(is_valid(r.text) for r in free)
    counters = engine.grammar_counters()
    assert counters.forced_tokens > 0 and counters.compile_hits >= len(PROMPTS) - 1


def test_jump_forward_gives_the_same_text_in_fewer_sampled_steps(engine: LLMEngine) -> None:
    forced_before = engine.grammar_counters().forced_tokens
    jumped = engine.generate(PROMPTS[:2], [constrained(7, True, 0.0)] * 2)
    forced = engine.grammar_counters().forced_tokens - forced_before
    plain = engine.generate(PROMPTS[:2], [constrained(7, False, 0.0)] * 2)
    assert [r.text for r in jumped] == [r.text for r in plain]
    assert forced > 0 and engine.grammar_counters().forced_tokens - forced_before == forced


@pytest.mark.parametrize("exact", [True, False], ids=["the-output-itself", "anything"])
def test_greedy_output_already_valid_is_unchanged(engine: LLMEngine, exact: bool) -> None:
    """A grammar the unconstrained greedy output already matches (that very text, or any text) leaves it as is."""
    greedy = SamplingParams(max_tokens=12, temperature=0)
    [free] = engine.generate(PROMPTS[:1], greedy)
    pattern = re.escape(free.text) if exact else r"(?s:.*)"
    spec = GrammarSpec("regex", pattern, jump_forward=False)
    [bound] = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=12, temperature=0, grammar=spec))
    assert bound.token_ids[:len(free.token_ids)] == free.token_ids and bound.text.startswith(free.text)


def test_batched_masks_equal_each_request_s_own(engine: LLMEngine) -> None:
    grammars = engine.grammars()
    spec = json_schema_spec(SCHEMA)
    prefixes = ['{"ok": true, "tool": "', '{"ok": ', '{"ok": false, "tool": "grep", "n": 1', '']
    ids = [f"mask-{i}" for i in range(len(prefixes))]
    for request_id, prefix in zip(ids, prefixes, strict=True):
        grammars.add(request_id, GrammarSpec(spec.kind, spec.source, jump_forward=False),
                     engine.tokenizer.encode(prefix) if prefix else [], 0)
    try:
        batched = grammars.bitmasks(ids)
        for row, request_id in enumerate(ids):
            assert batched[row].equal(grammars.bitmask(request_id))
        assert len({tuple(row.tolist()) for row in batched}) == len(ids)  # the states differ, so do the masks
    finally:
        for request_id in ids:
            grammars.remove(request_id)


def test_preemption_mid_json_still_gives_valid_and_the_same_json() -> None:
    roomy = LLMEngine("tiny", EngineSettings(num_kv_blocks=256, enable_prefix_caching=False))
    tight = LLMEngine("tiny", EngineSettings(num_kv_blocks=14, block_size=4, enable_prefix_caching=False))
    params = [constrained(seed) for seed in range(4)]
    expected = roomy.generate(PROMPTS[:4], params)
    got = tight.generate(PROMPTS[:4], params)
    assert tight.scheduler.num_preemptions > 0
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert all(is_valid(r.text) for r in got)


@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec("json_schema", '{"type": "strnig"}'), "cannot be enforced"),
    (GrammarSpec("json_schema", '{"type": "string", "format": "no-such-format"}'), "cannot be enforced"),
    (GrammarSpec("json_schema", "not json"), "invalid json_schema"),
    (GrammarSpec("lark", "start: (("), "cannot be enforced"),
])
def test_bad_grammars_are_refused_before_any_compute(engine: LLMEngine, spec: GrammarSpec, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        engine.add_request(PROMPTS[0], SamplingParams(grammar=spec))
    assert isinstance(GrammarError("x"), RequestError)
    assert not engine.has_unfinished()


def lazy_spec(trigger: str) -> GrammarSpec:
    body = json.dumps({"x-guidance": JSON_OPTIONS, **SCHEMA})
    return GrammarSpec("lark", f"start: {json.dumps(trigger)} body\nbody: %json {body}\n",
                       trigger=trigger)


def test_a_lazy_grammar_leaves_the_output_free_until_its_trigger_then_holds_it(engine: LLMEngine) -> None:
    """The greedy output's own text up to a trigger that starts inside one token and ends with another; from
    there on the grammar: the same text up to the trigger, then valid JSON."""
    [free] = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=12, temperature=0))
    trigger = free.text[free.text.index("venue") + 2:free.text.index("Invoice") + len("Invoice")]
    params = SamplingParams(max_tokens=40, temperature=0, grammar=lazy_spec(trigger))
    [bound] = engine.generate(PROMPTS[:1], params)
    head, _, rest = bound.text.partition(trigger)
    assert free.text.startswith(head + trigger) and is_valid(rest) and bound.finish_reason == "stop", bound.text
    [never] = engine.generate(PROMPTS[:1], SamplingParams(max_tokens=12, temperature=0, grammar=lazy_spec("#@!")))
    assert never.token_ids == free.token_ids  # no trigger: no constraint at all


def test_a_lazy_grammar_rebuilt_from_accepted_tokens_past_its_trigger_constrains(engine: LLMEngine) -> None:
    """A request continuing elsewhere (a decode worker) past its trigger: its matcher starts at once."""
    grammars = engine.grammars()
    accepted = engine.tokenizer.encode('then <x>{"ok": true, "tool": "')
    waiting = engine.tokenizer.encode("then <y")
    grammars.add("lazy-past", lazy_spec("<x>"), accepted, 0)
    grammars.add("lazy-before", lazy_spec("<x>"), waiting, 0)
    try:
        assert grammars.constrains("lazy-past") and not grammars.constrains("lazy-before")
        assert grammars.accept("lazy-before", engine.tokenizer.encode(">")[-1], 0) == []
        assert not grammars.constrains("lazy-before")  # "<y>" is not the trigger
    finally:
        grammars.remove("lazy-past")
        grammars.remove("lazy-before")


def test_a_grammar_is_validated_once_per_spec_and_a_bad_one_refused_every_time(monkeypatch):
    import llguidance

    from engine.core.sampling import grammar

    calls = []
    validate = llguidance.LLMatcher.validate_grammar_with_warnings
    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar_with_warnings",
                        lambda text: calls.append(text) or validate(text))
    grammar._grammar_problem.cache_clear()
    spec = json_schema_spec({"type": "object", "properties": {"n": {"type": "integer"}}})
    for _ in range(3):
        grammar.check_grammar(spec)
    assert len(calls) == 1
    bad = GrammarSpec("regex", "(unclosed")
    for _ in range(2):
        with pytest.raises(GrammarError, match="regex"):
            grammar.check_grammar(bad)
