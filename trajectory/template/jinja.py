"""A checkpoint's own Jinja chat template, rendered as `transformers`' `apply_chat_template` renders it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine import read_gguf_vocab
from trajectory.template.types import ChatTemplateError, Message, ToolSchemas

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
DEFAULT_TEMPLATE_NAME = "default"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatTemplateNotFoundError(ValueError):
    """A checkpoint directory or GGUF file holds no chat template of the requested name."""


class JinjaChatTemplate:
    """A Jinja chat template in `transformers`' sandbox: the same globals, filters and template variables.

    `special_tokens` are the strings the template sees as `bos_token`, `eos_token`, ...; `variables` are
    extra template variables (e.g. `enable_thinking`). The template writes bos itself when the model wants
    one, so the renderer adds none unless `prepend_bos` asks it to.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 variables: Mapping[str, Any] | None = None, prepend_bos: bool = False) -> None:
        self.source = source
        self.prepend_bos = prepend_bos
        self._template = _sandbox().from_string(source)
        self._variables = {**(special_tokens or {}), **(variables or {})}

    @classmethod
    def from_checkpoint(cls, model_dir: Path, name: str = DEFAULT_TEMPLATE_NAME,
                        variables: Mapping[str, Any] | None = None) -> JinjaChatTemplate:
        source = find_chat_template(model_dir, name)
        if source is None:
            raise ChatTemplateNotFoundError(f"no chat template {name!r} in checkpoint directory {model_dir}")
        return cls(source, read_special_tokens(model_dir), variables)

    @classmethod
    def from_gguf(cls, path: Path, variables: Mapping[str, Any] | None = None) -> JinjaChatTemplate:
        """`tokenizer.chat_template` of a GGUF file, seeing the file's bos/eos/unk/pad token strings; bos is
        prepended to the ids when the file's `tokenizer.ggml.add_bos_token` says so, as llama.cpp does."""
        vocab = read_gguf_vocab(path)
        if vocab.chat_template is None:
            raise ChatTemplateNotFoundError(f"no tokenizer.chat_template in GGUF file {path}")
        return cls(vocab.chat_template, vocab.special_token_texts(), variables, prepend_bos=vocab.add_bos_token)

    def render(self, messages: Sequence[Message], tools: ToolSchemas | None = None,
               add_generation_prompt: bool = False) -> str:
        try:
            return self._template.render(
                messages=[message.to_dict() for message in messages],
                tools=[dict(tool) for tool in tools] if tools is not None else None,
                documents=None, add_generation_prompt=add_generation_prompt, **self._variables)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template failed: {error}") from error


def find_chat_template(model_dir: Path, name: str = DEFAULT_TEMPLATE_NAME) -> str | None:
    """`chat_template.jinja` (the default template only), else `chat_template` in tokenizer_config.json."""
    template_file = model_dir / CHAT_TEMPLATE_FILE
    if name == DEFAULT_TEMPLATE_NAME and template_file.is_file():
        return template_file.read_text(encoding="utf-8")
    templates = _read_json_object(model_dir / TOKENIZER_CONFIG_FILE).get("chat_template")
    if isinstance(templates, list):
        return _named_template(templates, name)
    return templates if isinstance(templates, str) and name == DEFAULT_TEMPLATE_NAME else None


def read_special_tokens(model_dir: Path) -> dict[str, str]:
    """`bos_token`, `eos_token`, ... as strings; tokenizer_config.json wins over special_tokens_map.json."""
    tokens: dict[str, str] = {}
    for filename in (SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE):
        settings = _read_json_object(model_dir / filename)
        tokens |= {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(settings.get(name)))}
    return tokens


def _named_template(templates: list[Any], name: str) -> str | None:
    """A template from tokenizer_config.json's list form, `[{"name": ..., "template": ...}, ...]`."""
    for entry in templates:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get("template"), str):
            return str(entry["template"])
    return None


def _token_text(value: Any) -> str | None:
    """A special token written as its string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


class GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body; transformers uses it for assistant masks."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 reads this class attribute

    def parse(self, parser: jinja2.parser.Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class GuardedNamespace(jinja2.utils.Namespace):
    """Jinja's `namespace`, refusing underscore-prefixed attributes as transformers' sandbox does."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attributes = args[0], dict(*args[1:], **kwargs)
        for name in attributes:
            _check_attribute_name(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_attribute_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"chat templates cannot set the attribute {name!r} on a namespace")


def _sandbox() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                               namespace=GuardedNamespace)
    return environment


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Unlike Jinja's own `tojson`, escapes no HTML characters and takes json.dumps' options."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(date_format: str) -> str:
    return datetime.now().strftime(date_format)
