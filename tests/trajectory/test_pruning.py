"""Pruning on ingest: one example per rule, protected spans, per-role and per-tool config, idempotence."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engine.model.loader import load_tokenizer
from trajectory.pruning.prune import PruneResult, PruningConfig, prune

CONFIG = PruningConfig.load()


def words(text: str) -> int:
    return len(text.split())


def pruned(text: str, role: str = "tool", tool: str | None = None, config: PruningConfig = CONFIG) -> str:
    return prune(text, role, tool, config, words).text


def with_defaults(**rules: object) -> PruningConfig:
    return PruningConfig.model_validate({"defaults": rules})


def test_whitespace_runs_collapse_keeping_lines_and_indentation() -> None:
    text = "Results:   found\t\t3  items   \n    indented    child\t \n\tlast"
    assert pruned(text) == "Results: found 3 items\n    indented child\n\tlast"


def test_indentation_collapses_when_not_kept() -> None:
    assert pruned("    deep   child", config=with_defaults(keep_indentation=False)) == " deep child"


def test_blank_line_runs_collapse_to_one() -> None:
    assert pruned("first\n\n\n\n\nsecond\n \t\nthird") == "first\n\nsecond\n\nthird"


def test_punctuation_runs_shorten() -> None:
    text = "Wow!!!!!! ------------ loading........ done... -- ok?!"
    assert pruned(text) == "Wow!!! --- loading... done... -- ok?!"


def test_stop_word_runs_collapse_to_one() -> None:
    text = "the the the cat and and dog The the end, theme the thesis"
    assert pruned(text) == "the cat and dog The end, theme the thesis"


def test_consecutive_duplicate_lines_become_a_marker() -> None:
    line = "retrying the connection to the store in five seconds"
    text = f"start\n{line}\n{line}\n{line}\nok\n{line}"
    assert pruned(text, tool="shell") == f"start\n{line}\n[... 2 repeated lines removed]\nok\n{line}"


def test_text_stays_whole_when_pruning_would_cost_tokens() -> None:
    text = "start\nretrying\nretrying\nretrying\nok"  # the marker has more words than the two lines it replaces
    result = prune(text, "tool", "shell", CONFIG, words)
    assert result.text == text and result.tokens_before == result.tokens_after == 5
    assert not any(result.removed.values())


def test_all_duplicate_lines_dropped_and_one_repeat_gets_no_marker() -> None:
    text = "[1] link 'Home'\n[2] button 'Go'\n[1] link 'Home'\ntext\n[2] button 'Go'\n[1] link 'Home'"
    expected = "[1] link 'Home'\n[2] button 'Go'\ntext\n[... 2 repeated lines removed]"
    assert pruned(text, tool="browser") == expected


def test_duplicate_lines_without_marker_and_short_lines_kept() -> None:
    config = with_defaults(duplicate_lines="all", duplicate_marker=None, duplicate_min_chars=2)
    assert pruned("{\nitem\n}\n{\nitem\n}", config=config) == "{\nitem\n}\n{\n}"


def test_removed_reports_each_rule() -> None:
    x = "x" * 40  # long enough that the duplicate-line marker is shorter than the lines it replaces
    result = prune(f"a  b\n\n\n!!!!!!\nthe the\n{x}\n{x}\n{x}", "tool", None, CONFIG, len)
    assert result.removed == {"whitespace": 1, "punctuation": 3, "stop_words": 4, "blank_lines": 1,
                              "duplicate_lines": 2}


def test_code_fence_content_stays_byte_identical() -> None:
    fence = "```python\nx  =  1\n\n\n\nx  =  1\nprint('!!!!!!')  # the the\n```"
    text = f"intro   text\n{fence}\nafter  \n```\nunclosed    fence\nunclosed    fence"
    expected = f"intro text\n{fence}\nafter\n```\nunclosed    fence\nunclosed    fence"
    assert pruned(text, tool="browser") == expected


def test_json_body_stays_identical() -> None:
    body = '{\n  "items":  [1, 1],\n\n\n\n  "note": "the the   !!!!!!"\n}\n'
    result = prune(body, "tool", "browser", CONFIG, words)
    assert result.text == body
    assert result.tokens_after == result.tokens_before


def test_json_line_span_inside_prose_stays_identical() -> None:
    span = '[\n  {"id": 1,   "tag": "a"},\n  {"id": 1,   "tag": "a"}\n]'
    text = f"Response  follows:\n{span}\ndone  !!!!!!"
    assert pruned(text, tool="browser") == f"Response follows:\n{span}\ndone !!!"


def test_jsonl_lines_kept_and_bracketed_log_lines_pruned() -> None:
    text = '[INFO]   ready!!!!!!\n{"event":  "a"}\n{"event":  "a"}\n[1,   unclosed\n[INFO]   ready!!!!!!'
    expected = '[INFO] ready!!!\n{"event":  "a"}\n{"event":  "a"}\n[1, unclosed\n[INFO] ready!!!'
    assert pruned(text, tool="shell") == expected
    assert pruned(text, tool="browser") == expected.rsplit("\n", 1)[0]


def test_json_line_spans_pruned_when_not_protected() -> None:
    config = with_defaults(protect_json_spans=False)
    assert pruned('note\n{"a":   1}', config=config) == 'note\n{"a": 1}'


@pytest.mark.parametrize("role", ["system", "user"])
def test_system_and_user_roles_untouched(role: str) -> None:
    text = "Do  this!!!!!!\n\n\n\nthe the task\nrepeat\nrepeat"
    result = prune(text, role, "browser", CONFIG, words)
    assert result.text == text
    assert result.tokens_before == result.tokens_after == 7
    assert not any(result.removed.values())


def test_tool_override_differs_from_default() -> None:
    text = "row\nother\nrow"
    assert pruned(text) == text
    assert pruned(text, tool="shell") == text
    assert pruned(text, tool="browser") == "row\nother"


def test_tool_override_cannot_prune_an_unpruned_role() -> None:
    config = PruningConfig.model_validate({"tools": {"x": {"enabled": True}}})
    assert not config.rules_for("system", "x").enabled
    assert config.rules_for("tool", "x").enabled


def test_override_order_is_defaults_role_tool() -> None:
    config = PruningConfig.model_validate({
        "defaults": {"punctuation_keep": 1}, "roles": {"tool": {"punctuation_keep": 2}},
        "tools": {"ls": {"punctuation_keep": 3}}})
    assert config.rules_for("observation", None).punctuation_keep == 1
    assert config.rules_for("tool", None).punctuation_keep == 2
    assert config.rules_for("tool", "ls").punctuation_keep == 3


def test_tokens_before_and_after_with_a_word_counter() -> None:
    result = prune("the the the cat\n" + "sat\n" * 7, "tool", None, CONFIG, words)
    assert result == PruneResult("the cat\nsat\n[... 6 repeated lines removed]\n", 11, 8, result.removed)


def test_tokens_with_the_builtin_tokenizer() -> None:
    tokenizer = load_tokenizer(None)
    text = "status:     ok\n" + "=" * 40 + "\n" + "line repeated\n" * 20

    def count(s: str) -> int:
        return len(tokenizer.encode(s))

    result = prune(text, "tool", "shell", CONFIG, count)
    assert result.tokens_before == count(text)
    assert result.tokens_after == count(result.text)
    assert result.tokens_after < result.tokens_before / 2


def test_config_loads_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "pruning.yaml"
    path.write_text("unpruned_roles: [system]\ndefaults:\n  duplicate_lines: off\n"
                    "tools:\n  grep:\n    duplicate_lines: all\n    max_blank_lines: null\n")
    config = PruningConfig.load(path)
    assert config.rules_for("user", None).enabled
    assert config.rules_for("tool", None).duplicate_lines == "off"
    assert config.rules_for("tool", "grep").max_blank_lines is None


@pytest.mark.parametrize("yaml_text", ["defaults:\n  colapse: true\n", "tools:\n  shell:\n    mode: all\n",
                                       "pruning: {}\n", "roles:\n  tool:\n    punctuation_keep: 9\n"])
def test_unknown_or_invalid_key_is_an_error(tmp_path: Path, yaml_text: str) -> None:
    path = tmp_path / "pruning.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValidationError):
        PruningConfig.load(path)


FRAGMENTS = ["the", "the the", " and and ", "a", "word", "cat", "  ", "\t", " \t ", "\n", "\n\n\n", "!!!!!",
             "...", "-------", "___", "?", "``` ", "```\n", "~~~~\n", "{", "}", "[", "]", '{"a":  1}', "[1,  2]",
             '"x"', ",", ":", "[... 3 repeated lines removed]", "row A\n", "row A\n", "  row B\n", "é", "\r"]
TEXTS = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=40).map("".join)
LINE_TEXTS = st.lists(st.sampled_from(["row A", "row A", "  row B", "", "  ", "the the", "{", "}", "[1]", "```",
                                       "!!!!!", '"x": 1,', "[... 2 repeated lines removed]"]),
                      max_size=30).map("\n".join)
CONFIGS = [CONFIG, with_defaults(keep_indentation=False, max_blank_lines=0, duplicate_lines="all"),
           with_defaults(punctuation_min_run=2, punctuation_keep=1, duplicate_marker_min_lines=1),
           with_defaults(duplicate_lines="all", duplicate_marker=None, protect_json_spans=False)]
TOOLS = [None, "browser", "shell"]


@settings(deadline=None, max_examples=200)
@given(text=st.one_of(TEXTS, LINE_TEXTS), config=st.sampled_from(CONFIGS), tool=st.sampled_from(TOOLS))
def test_prune_is_idempotent(text: str, config: PruningConfig, tool: str | None) -> None:
    once = pruned(text, tool=tool, config=config)
    assert pruned(once, tool=tool, config=config) == once
    assert pruned(text, tool=tool, config=config) == once
