"""The message and chat-template types shared by the default template, Jinja templates and the renderer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = get_args(Role)
ToolSchemas = Sequence[Mapping[str, Any]]


class ChatTemplateError(ValueError):
    """A chat template rejected the conversation (its `raise_exception`) or failed to render it."""


@dataclass(frozen=True)
class Message:
    """One chat message in OpenAI's shape: tool calls on assistant messages, tool_call_id/name on tool results."""

    role: Role
    content: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown message role {self.role!r}; expected one of {ROLES}")

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> Message:
        """An OpenAI chat message dict; a null content becomes the empty string."""
        return cls(role=data["role"], content=data.get("content") or "", tool_calls=data.get("tool_calls"),
                   tool_call_id=data.get("tool_call_id"), name=data.get("name"))

    def to_dict(self) -> dict[str, Any]:
        """The dict a chat template sees: unset fields left out, as `transformers` drops None-valued keys."""
        fields = {"role": self.role, "content": self.content, "tool_calls": self.tool_calls,
                  "tool_call_id": self.tool_call_id, "name": self.name}
        return {key: value for key, value in fields.items() if value is not None}


class ChatTemplate(Protocol):
    """Renders a whole conversation to text; `IncrementalRenderer` turns that into append-only token ids."""

    @property
    def prepend_bos(self) -> bool:
        """Whether the renderer puts the tokenizer's bos before the first message when the text lacks it."""
        ...

    def render(self, messages: Sequence[Message], tools: ToolSchemas | None = None,
               add_generation_prompt: bool = False) -> str: ...


class MessageLocalTemplate(ChatTemplate, Protocol):
    """A template that renders every message on its own, whatever its neighbours (prefix-stable by
    construction): the renderer asks it for one message's text instead of rendering the conversation."""

    end_of_turn_text: str  # what follows an assistant reply's content

    def message_text(self, message: Message, first: bool, tools: ToolSchemas | None) -> str:
        """What appending `message` adds to the rendering; `first`: the conversation was empty."""
        ...

    def generation_prompt(self, first: bool, tools: ToolSchemas | None) -> str:
        """What the generation prompt adds to the rendering; `first`: the conversation is empty."""
        ...
