import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.model.loader import load_tokenizer
from engine.model.tokenizer import HFTokenizer, Tokenizer
from trajectory.template.default import (
    ROLES,
    ChatTemplate,
    ChatTemplateError,
    DefaultChatTemplate,
    IncrementalRenderer,
    JinjaChatTemplate,
    Message,
    load_chat_template,
)

LLAMA3_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\nYou have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
        {{- message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
           or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|im_start|>", "<|im_end|>"]
LLAMA3_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
CHATML_TOKENS = {"eos_token": "<|im_end|>"}
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_CALL = call("call_1", "get_weather", {"city": "Paris"})
CONVERSATIONS = {
    "plain": [Message("system", "  Be brief. "), Message("user", "Hi\nthere"), Message("assistant", "Hello!"),
              Message("user", "Ça va? 你好 🙂\t")],
    "no_system": [Message("user", "What is 2+2?")],
    "tool_flow": [Message("user", "Weather in Paris?"), Message("assistant", "", tool_calls=[WEATHER_CALL]),
                  Message("tool", "18°C, cloudy", tool_call_id="call_1", name="get_weather"),
                  Message("assistant", "It is 18°C and cloudy.")],
}
PARALLEL_CALLS = [Message("user", "Paris and Oslo?"),
                  Message("assistant", "Checking.", tool_calls=[WEATHER_CALL,
                                                               call("call_2", "get_weather", {"city": "Oslo"})]),
                  Message("tool", "18°C", tool_call_id="call_1"), Message("tool", "3°C", tool_call_id="call_2")]


@dataclass
class Setup:
    template: ChatTemplate
    tokenizer: Tokenizer
    decode_all: Callable[[Sequence[int]], str]


@pytest.fixture(scope="module")
def hf_backend() -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    corpus = [json.dumps(TOOLS), "the weather in Paris is cloudy", "Hello there, how are you?"] * 4
    backend.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return backend


def hf_tokenizer(backend: tokenizers.Tokenizer, tokens: dict[str, str]) -> HFTokenizer:
    bos = tokens.get("bos_token")
    return HFTokenizer(backend, backend.token_to_id(bos) if bos else None, backend.token_to_id(tokens["eos_token"]))


def transformers_text(backend: tokenizers.Tokenizer, source: str, tokens: dict[str, str],
                      messages: list[Message], tools: list[Any] | None, generation_prompt: bool = False) -> str:
    reference = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=source, **tokens)
    return str(reference.apply_chat_template([m.to_dict() for m in messages], tools=tools,
                                             add_generation_prompt=generation_prompt, tokenize=False))


def hf_setup(backend: tokenizers.Tokenizer, source: str, tokens: dict[str, str]) -> Setup:
    return Setup(JinjaChatTemplate(source, tokens), hf_tokenizer(backend, tokens),
                 lambda ids: backend.decode(list(ids), skip_special_tokens=False))


@pytest.fixture(scope="module")
def builtin() -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture(scope="module", params=["default", "llama3", "chatml"])
def setup(request: pytest.FixtureRequest, builtin: Tokenizer, hf_backend: tokenizers.Tokenizer) -> Setup:
    if request.param == "default":
        return Setup(DefaultChatTemplate(), builtin, builtin.decode)
    if request.param == "llama3":
        return hf_setup(hf_backend, LLAMA3_TEMPLATE, LLAMA3_TOKENS)
    return hf_setup(hf_backend, CHATML_TEMPLATE, CHATML_TOKENS)


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no_tools", "tools"])
@pytest.mark.parametrize("generation_prompt", [False, True], ids=["closed", "prompted"])
@pytest.mark.parametrize("source,tokens", [(LLAMA3_TEMPLATE, LLAMA3_TOKENS), (CHATML_TEMPLATE, CHATML_TOKENS)],
                         ids=["llama3", "chatml"])
@pytest.mark.parametrize("name", CONVERSATIONS)
def test_jinja_renders_like_transformers(hf_backend: tokenizers.Tokenizer, source: str, tokens: dict[str, str],
                                         name: str, tools: list[dict[str, Any]] | None,
                                         generation_prompt: bool) -> None:
    messages = CONVERSATIONS[name]
    expected = transformers_text(hf_backend, source, tokens, messages, tools, generation_prompt)
    assert JinjaChatTemplate(source, tokens).render(messages, tools, generation_prompt) == expected
    renderer = IncrementalRenderer(JinjaChatTemplate(source, tokens), hf_tokenizer(hf_backend, tokens), tools)
    for message in messages:
        renderer.append(message)
    prompt = renderer.generation_prompt_ids() if generation_prompt else []
    assert renderer.prefix_stable
    assert hf_backend.decode(renderer.token_ids + prompt, skip_special_tokens=False) == expected


def test_chatml_parallel_tool_calls_like_transformers(hf_backend: tokenizers.Tokenizer) -> None:
    expected = transformers_text(hf_backend, CHATML_TEMPLATE, CHATML_TOKENS, PARALLEL_CALLS, TOOLS)
    assert JinjaChatTemplate(CHATML_TEMPLATE, CHATML_TOKENS).render(PARALLEL_CALLS, TOOLS) == expected
    assert expected.count("<tool_call>") == 2 and expected.count("<|im_start|>user") == 2


def test_grouped_tool_results_are_not_prefix_stable_but_stay_append_only(hf_backend: tokenizers.Tokenizer) -> None:
    renderer = IncrementalRenderer(JinjaChatTemplate(CHATML_TEMPLATE, CHATML_TOKENS),
                                   hf_tokenizer(hf_backend, CHATML_TOKENS))
    before = [token for message in PARALLEL_CALLS[:3] for token in renderer.append(message)]
    added = renderer.append(PARALLEL_CALLS[3])
    assert not renderer.prefix_stable
    assert renderer.token_ids == before + added
    assert renderer.turns[-1].text == "\n<tool_response>\n3°C\n</tool_response><|im_end|>\n"


def test_default_template_exact_text(builtin: Tokenizer) -> None:
    messages = [Message("system", "Be brief."), Message("user", "Weather in Paris?"),
                Message("assistant", "Let me check.", tool_calls=[
                    call("call_1", "get_weather", '{"city": "Paris"}'),
                    {"function": {"name": "note", "arguments": "not json"}}]),
                Message("tool", "18°C, cloudy", tool_call_id="call_1", name="get_weather"),
                Message("tool", "ok")]
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert DefaultChatTemplate().render(messages, tools, add_generation_prompt=True) == (
        '<|im_start|>tools\n{"type": "function", "function": {"name": "get_weather"}}<|im_end|>\n'
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "note", "arguments": "not json"}</tool_call><|im_end|>\n'
        '<|im_start|>tool\n<tool_response id="call_1" name="get_weather">\n18°C, cloudy\n</tool_response>'
        "<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_first_message_gets_bos_once(builtin: Tokenizer, hf_backend: tokenizers.Tokenizer) -> None:
    default = IncrementalRenderer(DefaultChatTemplate(), builtin)
    assert default.append(Message("user", "hi")) == [1, *builtin.encode("<|im_start|>user\nhi<|im_end|>\n")]
    assert 1 not in default.append(Message("user", "again"))
    bos = hf_backend.token_to_id("<|begin_of_text|>")
    assert bos is not None
    for prepend_bos in (False, True):
        llama = IncrementalRenderer(JinjaChatTemplate(LLAMA3_TEMPLATE, LLAMA3_TOKENS, prepend_bos=prepend_bos),
                                    hf_tokenizer(hf_backend, LLAMA3_TOKENS))
        assert llama.append(Message("user", "hi")).count(bos) == 1
    chatml_with_bos = hf_tokenizer(hf_backend, {**CHATML_TOKENS, "bos_token": "<|begin_of_text|>"})
    chatml = IncrementalRenderer(JinjaChatTemplate(CHATML_TEMPLATE, CHATML_TOKENS), chatml_with_bos)
    assert bos not in chatml.append(Message("user", "hi"))


def test_assistant_turn_layout(setup: Setup) -> None:
    renderer = IncrementalRenderer(setup.template, setup.tokenizer)
    history = renderer.append(Message("user", "Weather?"))
    header = renderer.generation_prompt_ids()
    probe = IncrementalRenderer(setup.template, setup.tokenizer)
    probe.append(Message("user", "Weather?"))
    probe.append(Message("assistant", "Sunny."))
    end_text = probe.turns[-1].text.rpartition("Sunny.")[2]
    generated = setup.tokenizer.encode("Sunny.")
    turn = renderer.assistant_turn_ids(generated)
    assert turn == header + generated + setup.tokenizer.encode(end_text)
    assert renderer.token_ids == history + turn
    assert renderer.messages[-1] == Message("assistant", "Sunny.")
    stopped = [*generated, *setup.tokenizer.encode(end_text)[:1]]
    again = IncrementalRenderer(setup.template, setup.tokenizer)
    again.append(Message("user", "Weather?"))
    assert again.assistant_turn_ids(stopped) == header + generated + setup.tokenizer.encode(end_text)
    assert renderer.append(Message("user", "Thanks")) == again.append(Message("user", "Thanks"))
    assert renderer.prefix_stable and again.prefix_stable


@pytest.mark.parametrize("reply,content,end", [("Done.<|im_end|>", "Done.", "\n"),
                                               ("a <", "a <", "<|im_end|>\n")])
def test_generated_end_marker_in_plain_text(builtin: Tokenizer, reply: str, content: str, end: str) -> None:
    renderer = IncrementalRenderer(DefaultChatTemplate(), builtin)
    renderer.append(Message("user", "Go"))
    generated = builtin.encode(reply)
    assert renderer.assistant_turn_ids(generated) == [*builtin.encode("<|im_start|>assistant\n"), *generated,
                                                      *builtin.encode(end)]
    assert renderer.messages[-1].content == content


def test_restored_renderer_continues_the_stream(setup: Setup) -> None:
    renderer = IncrementalRenderer(setup.template, setup.tokenizer, TOOLS)
    for message in CONVERSATIONS["tool_flow"][:3]:
        renderer.append(message)
    restored = IncrementalRenderer.restore(setup.template, setup.tokenizer, TOOLS, renderer.turns,
                                           renderer.prefix_stable)
    last = CONVERSATIONS["tool_flow"][3]
    assert restored.generation_prompt_ids() == renderer.generation_prompt_ids()
    assert restored.append(last) == renderer.append(last)
    assert restored.token_ids == renderer.token_ids


def test_tool_calls_rendered_in_stream(setup: Setup) -> None:
    renderer = IncrementalRenderer(setup.template, setup.tokenizer)
    for message in CONVERSATIONS["tool_flow"]:
        renderer.append(message)
    text = setup.decode_all(renderer.token_ids)
    assert "get_weather" in text and "Paris" in text and "18°C, cloudy" in text


def test_template_raise_exception_is_a_chat_template_error() -> None:
    two_calls = Message("assistant", "", tool_calls=[WEATHER_CALL, WEATHER_CALL])
    with pytest.raises(ChatTemplateError, match="single tool-calls"):
        JinjaChatTemplate(LLAMA3_TEMPLATE, LLAMA3_TOKENS).render([Message("user", "x"), two_calls])
    for unsafe in ("{{ messages.append(1) }}", "{% set ns = namespace() %}{% set ns._x = 1 %}"):
        with pytest.raises(ChatTemplateError, match=r"unsafe|cannot set"):
            JinjaChatTemplate(unsafe).render([Message("user", "x")])


def test_load_chat_template(tmp_path: Path) -> None:
    assert isinstance(load_chat_template(None), DefaultChatTemplate)
    assert isinstance(load_chat_template(tmp_path), DefaultChatTemplate)
    config: dict[str, Any] = {"chat_template": "{{ bos_token }}|{{ messages[0].content }}",
              "bos_token": {"content": "<s>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(tmp_path).render([Message("user", "hi")]) == "<s>|hi"
    config["chat_template"] = [{"name": "default", "template": "named {{ bos_token }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(tmp_path).render([]) == "named <s>"
    (tmp_path / "chat_template.jinja").write_text("file {{ messages | length }}")
    assert load_chat_template(tmp_path).render([Message("user", "hi")]) == "file 1"


def test_message_from_openai() -> None:
    data = {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}
    assert Message.from_openai(data) == Message("assistant", "", tool_calls=[WEATHER_CALL])
    assert Message.from_openai(data).to_dict() == {"role": "assistant", "content": "", "tool_calls": [WEATHER_CALL]}
    with pytest.raises(ValueError, match="unknown message role"):
        Message.from_openai({"role": "ipython", "content": "x"})


TEXT = st.text(st.characters(exclude_categories=["Cs"]) | st.sampled_from(" \n\t\r"), max_size=40)
MESSAGES = st.builds(Message, role=st.sampled_from(ROLES), content=TEXT, tool_calls=st.none() | st.just([WEATHER_CALL]),
                     tool_call_id=st.none() | st.just("call_1"), name=st.none() | st.just("get_weather"))
GENERATED = st.lists(st.integers(3, 250), max_size=6)
STEPS = st.tuples(MESSAGES, st.lists(MESSAGES | GENERATED, max_size=7)).map(lambda steps: [steps[0], *steps[1]])


@settings(deadline=None, max_examples=100)
@given(steps=STEPS)
def test_appending_never_changes_earlier_ids(setup: Setup, steps: list[Message | list[int]]) -> None:
    renderer = IncrementalRenderer(setup.template, setup.tokenizer)
    history: list[int] = []
    for step in steps:
        added = renderer.append(step) if isinstance(step, Message) else renderer.assistant_turn_ids(step)
        if isinstance(step, Message):
            assert setup.decode_all(added) == renderer.turns[-1].text
        assert renderer.token_ids[:len(history)] == history
        assert renderer.token_ids == history + added
        history = renderer.token_ids
    if renderer.prefix_stable:
        assert renderer.text == setup.template.render(renderer.messages)
