"""The default template's message-local path: the renderer asks it for one message's text instead of
rendering the whole conversation, and must give exactly what rendering the conversation gives."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.loader import load_tokenizer
from engine.model.tokenizer import Tokenizer
from trajectory.template.default import DefaultChatTemplate, IncrementalRenderer
from trajectory.template.types import ROLES, Message, ToolSchemas
from trajectory.tokenizer_cache import MAX_CHARS, CachingTokenizer

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}
TEXT = st.text(st.characters(exclude_categories=["Cs"]) | st.sampled_from(" \n\t"), max_size=30)
MESSAGES = st.builds(Message, role=st.sampled_from(ROLES), content=TEXT, tool_calls=st.none() | st.just([CALL]),
                     tool_call_id=st.none() | st.just("call_1"), name=st.none() | st.just("shell"))
STEPS = st.lists(MESSAGES | st.lists(st.integers(3, 250), max_size=6), min_size=1, max_size=8)


class WholeConversationTemplate:
    """The default template seen only through `render`: the renderer's generic path."""

    prepend_bos = True

    def render(self, messages: Sequence[Message], tools: ToolSchemas | None = None,
               add_generation_prompt: bool = False) -> str:
        return DefaultChatTemplate().render(messages, tools, add_generation_prompt)


@pytest.fixture(scope="module")
def builtin() -> Tokenizer:
    return load_tokenizer(None)


def grow(renderer: IncrementalRenderer, steps: list[Message | list[int]]) -> list[list[int]]:
    """Each step's ids, the generation prompt's before each reply included."""
    added = []
    for step in steps:
        if isinstance(step, Message):
            added.append(renderer.append(step))
        else:
            added += [renderer.generation_prompt_ids(), renderer.assistant_turn_ids(step)]
    return added


@settings(deadline=None, max_examples=100)
@given(steps=STEPS, tools=st.none() | st.just(TOOLS))
def test_message_local_path_matches_rendering_the_conversation(builtin: Tokenizer, steps: list[Message | list[int]],
                                                              tools: ToolSchemas | None) -> None:
    local = IncrementalRenderer(DefaultChatTemplate(), builtin, tools)
    whole = IncrementalRenderer(WholeConversationTemplate(), builtin, tools)
    assert grow(local, steps) == grow(whole, steps)
    assert local.turns == whole.turns and local.prefix_stable and whole.prefix_stable
    assert local.generation_prompt_ids() == whole.generation_prompt_ids()


def test_restored_message_local_renderer_continues_like_the_generic_one(builtin: Tokenizer) -> None:
    steps: list[Message | list[int]] = [Message("system", "Be brief."), Message("user", "List files."),
                                        builtin.encode("Sure."), Message("tool", "a.py b.py", tool_call_id="call_1")]
    local = IncrementalRenderer(DefaultChatTemplate(), builtin, TOOLS)
    grow(local, steps)
    restored = [IncrementalRenderer.restore(template, builtin, TOOLS, local.turns, True)
                for template in (DefaultChatTemplate(), WholeConversationTemplate())]
    more: list[Message | list[int]] = [Message("user", "Now read a.py"), builtin.encode("Reading it.")]
    assert grow(restored[0], more) == grow(restored[1], more)
    assert restored[0].turns == restored[1].turns


def test_caching_tokenizer_gives_the_tokenizers_ids(builtin: Tokenizer) -> None:
    cached = CachingTokenizer(builtin)
    for text in ("<|im_start|>assistant\n", "<|im_end|>\n", "x" * (MAX_CHARS + 1), ""):
        for add_bos in (False, True):
            first = cached.encode(text, add_bos)
            first.append(-1)  # a caller changing its list must not change the next answer
            assert cached.encode(text, add_bos) == builtin.encode(text, add_bos)
    assert cached.decode([5, 6, 7]) == builtin.decode([5, 6, 7])
    assert (cached.bos_token_id, cached.eos_token_id, cached.vocab_size) == (
        builtin.bos_token_id, builtin.eos_token_id, builtin.vocab_size)
