"""A GGUF file's chat template: rendered as transformers renders it, and tokenized incrementally as a whole."""

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.loader import load_tokenizer
from engine.model.tokenizer import Tokenizer
from tests.engine.model.test_gguf_tokenizer import smollm_path, smollm_reference, transformers_digit_bug, write_gguf
from trajectory.template.default import (
    DefaultChatTemplate,
    IncrementalRenderer,
    JinjaChatTemplate,
    Message,
    load_chat_template,
)

CONVERSATIONS = {
    "system_user_assistant": [Message("system", "Be brief."), Message("user", "What is the capital of France?"),
                              Message("assistant", "Paris.")],
    "no_system": [Message("user", "Hi there!")],
    "multi_turn": [Message("system", "  You are a coding agent.\n"), Message("user", "List files."),
                   Message("assistant", "```bash\nls -la\n```"), Message("user", "total 8\ndrwxr-xr-x 2 root"),
                   Message("assistant", "The folder is empty."), Message("user", "Ça va? 你好 🙂\t")],
    "tool_result": [Message("user", "Weather in Paris?"), Message("assistant", "Checking."),
                    Message("tool", '{"temp": "18°C", "sky": "cloudy"}', tool_call_id="call_1")],
    "empty_contents": [Message("system", ""), Message("user", ""), Message("assistant", "")],
}
MARKERS = [" ", "\n", "\t", "7", "<|im_end|>", "<|im_start|>"]
PIECES = st.characters(exclude_categories=["Cs"]) | st.sampled_from(MARKERS)
TEXT = st.lists(PIECES, max_size=30).map("".join)
MESSAGES = st.builds(Message, role=st.sampled_from(["system", "user", "assistant", "tool"]), content=TEXT)


@pytest.fixture(scope="module")
def template() -> JinjaChatTemplate:
    loaded = load_chat_template(smollm_path())
    assert isinstance(loaded, JinjaChatTemplate)
    return loaded


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer(smollm_path())


def transformers_text(messages: list[Message], generation_prompt: bool) -> str:
    return str(smollm_reference().apply_chat_template([message.to_dict() for message in messages], tokenize=False,
                                                      add_generation_prompt=generation_prompt))


@pytest.mark.slow
@pytest.mark.parametrize("generation_prompt", [False, True], ids=["closed", "prompted"])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_renders_like_transformers(template: JinjaChatTemplate, tokenizer: Tokenizer, name: str,
                                   generation_prompt: bool) -> None:
    messages = CONVERSATIONS[name]
    expected = transformers_text(messages, generation_prompt)
    assert template.render(messages, add_generation_prompt=generation_prompt) == expected
    renderer = IncrementalRenderer(template, tokenizer)
    for message in messages:
        renderer.append(message)
    prompt = renderer.generation_prompt_ids() if generation_prompt else []
    assert renderer.prefix_stable and not template.prepend_bos
    assert renderer.token_ids + prompt == tokenizer.encode(expected)
    assert not transformers_digit_bug(expected)
    assert tokenizer.encode(expected) == smollm_reference().encode(expected, add_special_tokens=False)


@pytest.mark.slow
def test_real_template_text(template: JinjaChatTemplate) -> None:
    assert template.render([Message("user", "Hi")], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_assistant_turn_layout(template: JinjaChatTemplate, tokenizer: Tokenizer) -> None:
    renderer = IncrementalRenderer(template, tokenizer)
    history = renderer.append(Message("user", "Weather?"))
    header = renderer.generation_prompt_ids()
    assert header == tokenizer.encode("<|im_start|>assistant\n")
    generated = tokenizer.encode("Sunny.")
    turn = renderer.assistant_turn_ids([*generated, *tokenizer.encode("<|im_end|>")])
    assert turn == header + generated + tokenizer.encode("<|im_end|>\n")
    assert renderer.token_ids == history + turn
    assert renderer.messages[-1] == Message("assistant", "Sunny.")
    renderer.append(Message("user", "Thanks"))
    assert renderer.prefix_stable
    assert renderer.token_ids == tokenizer.encode(template.render(renderer.messages))


@pytest.mark.slow
@settings(deadline=None, max_examples=60)
@given(messages=st.lists(MESSAGES, min_size=1, max_size=6))
def test_incremental_ids_equal_whole_render(template: JinjaChatTemplate, tokenizer: Tokenizer,
                                            messages: list[Message]) -> None:
    renderer = IncrementalRenderer(template, tokenizer)
    for message in messages:
        renderer.append(message)
    assert renderer.prefix_stable
    whole = template.render(messages, add_generation_prompt=True)
    assert renderer.token_ids + renderer.generation_prompt_ids() == tokenizer.encode(whole)


def tiny_vocab(**fields: Any) -> dict[str, Any]:
    tokens = ["<s>", "</s>", *"abcdefghijklmnopqrstuvwxyz", "Ġ", "ab"]
    return dict(tokenizer_model="gpt2", tokenizer_pre="gpt-2", token_list=tokens,
                token_types=[3, 3] + [1] * (len(tokens) - 2), token_merges=["a b"], bos_token_id=0,
                eos_token_id=1, **fields)


def test_gguf_without_chat_template_falls_back(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "plain.gguf", **tiny_vocab())
    assert isinstance(load_chat_template(path), DefaultChatTemplate)


def test_gguf_template_sees_its_special_tokens(tmp_path: Path) -> None:
    source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    path = write_gguf(tmp_path / "chat.gguf", chat_template=source, add_bos_token=True, **tiny_vocab())
    template = load_chat_template(path)
    assert isinstance(template, JinjaChatTemplate) and template.prepend_bos
    assert template.render([Message("user", "hi"), Message("assistant", "yo")]) == "<s>hi</s>yo</s>"
    renderer = IncrementalRenderer(template, load_tokenizer(path))
    assert renderer.append(Message("user", "hi")).count(0) == 1


def test_bad_gguf_is_a_one_line_value_error(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="not a readable GGUF file") as raised:
        load_chat_template(tmp_path / "broken.gguf")
    assert "\n" not in str(raised.value)
