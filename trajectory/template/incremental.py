"""Append-only token ids for a conversation: each message is tokenized on its own, so earlier ids never change."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

from engine import Tokenizer
from trajectory import step_timer
from trajectory.template.types import ChatTemplate, Message, MessageLocalTemplate, ToolSchemas

END_OF_TURN_PROBE = "agentserve-end-of-turn-probe"
T = TypeVar("T")


@dataclass(frozen=True)
class RenderedTurn:
    """One message as the session holds it: the template's text for it, and the ids its KV is computed from.

    For a generated reply the ids are the engine's own (header + generated + end of turn), which need not be
    what tokenizing `text` would give.
    """

    message: Message
    text: str
    token_ids: tuple[int, ...]


class IncrementalRenderer:
    """One conversation's token stream, grown a message at a time and never rewritten.

    A message's text is what rendering the conversation with it adds to the rendering without it. When the
    template rewrites earlier text as the conversation grows (`prefix_stable` turns False), the text is
    taken past the longest common prefix of the two renderings instead: the stream stays append-only and
    stops matching a whole-conversation rendering exactly.
    """

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, tools: ToolSchemas | None = None) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.tools = tuple(tools) if tools is not None else None
        self.prefix_stable = True
        self._turns: list[RenderedTurn] = []
        self._ids = array("i")  # the token stream so far: C ints, which the cyclic collector does not visit
        self._rendered = ""  # the conversation so far, rendered whole (not kept for a message-local template)
        self._local = _message_local(template)
        self._prompted: tuple[int, str] | None = None  # (turns, the rendering with the generation prompt)

    @classmethod
    def restore(cls, template: ChatTemplate, tokenizer: Tokenizer, tools: ToolSchemas | None,
                turns: Sequence[RenderedTurn], prefix_stable: bool) -> IncrementalRenderer:
        """A renderer continuing a stored session: its turns kept as they are, the conversation re-rendered once
        (unless the template is message-local)."""
        renderer = cls(template, tokenizer, tools)
        renderer._turns = list(turns)
        renderer._ids = array("i", [token_id for turn in turns for token_id in turn.token_ids])
        renderer._rendered = renderer._render(renderer.messages) if turns and renderer._local is None else ""
        renderer.prefix_stable = prefix_stable
        return renderer

    @property
    def turns(self) -> tuple[RenderedTurn, ...]:
        return tuple(self._turns)

    @property
    def messages(self) -> list[Message]:
        return [turn.message for turn in self._turns]

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    def ids_then(self, suffix: Sequence[int]) -> list[int]:
        """The token stream so far followed by `suffix` (the assistant header, say), as a new list."""
        return [*self._ids, *suffix]

    @property
    def text(self) -> str:
        return "".join(turn.text for turn in self._turns)

    def append(self, message: Message) -> list[int]:
        """The ids of just `message`, tokenized on its own; bos comes first on the first message."""
        step_timer.enter("render_tokenize")
        text, rendered = self._message_text(message)
        ids = self._encode(text)
        self._record(RenderedTurn(message, text, tuple(ids)), rendered)
        step_timer.leave("render_tokenize")
        return ids

    def generation_prompt_ids(self) -> list[int]:
        """The assistant header to prefill before generating a reply; nothing is recorded."""
        step_timer.enter("render_tokenize")
        ids = self._encode(self._generation_prompt_text())
        step_timer.leave("render_tokenize")
        return ids

    def assistant_turn_ids(self, generated_ids: Sequence[int], message: Message | None = None) -> list[int]:
        """Records a generated reply as header + `generated_ids` + whatever end-of-turn ids they lack.

        `message` is the reply as later renderings see it (its tool calls parsed, say); by default the
        decoded generated text, less any end-of-turn text it ends with. The returned ids are what the
        session's history holds for the turn.
        """
        step_timer.enter("render_tokenize")
        end_text = self._end_of_turn_text()
        written = self.tokenizer.decode(generated_ids)
        ids = [*self.generation_prompt_ids(), *generated_ids, *self._missing_end(generated_ids, written, end_text)]
        reply = message if message is not None else Message("assistant", _without_end(written, end_text))
        text, rendered = self._message_text(reply)
        self._record(RenderedTurn(reply, text, tuple(ids)), rendered)
        step_timer.leave("render_tokenize")
        return ids

    def _missing_end(self, generated_ids: Sequence[int], written: str, end_text: str) -> list[int]:
        """The end-of-turn ids left once the part that ends the generated ids (or their text) is cut."""
        end_ids = self.tokenizer.encode(end_text)
        token_overlap = _overlap(list(generated_ids), end_ids)
        if token_overlap:
            return end_ids[token_overlap:]
        return self.tokenizer.encode(end_text[_marker_overlap(written, end_text):])

    def _message_text(self, message: Message) -> tuple[str, str]:
        if self._local is not None:
            return self._local.message_text(message, not self._turns, self.tools), ""
        rendered = self._render([*self.messages, message])
        return self._added_text(rendered), rendered

    def _generation_prompt_text(self) -> str:
        if self._local is not None:
            return self._local.generation_prompt(not self._turns, self.tools)
        return self._added_text(self._prompted_rendering())

    def _end_of_turn_text(self) -> str:
        """What the template writes after an assistant reply's content, found by rendering a probe reply."""
        if self._local is not None:
            return self._local.end_of_turn_text
        prompted = self._prompted_rendering()
        closed = self._render([*self.messages, Message("assistant", END_OF_TURN_PROBE)])
        reply = closed[_common_prefix_length(prompted, closed):]
        _, found, end = reply.partition(END_OF_TURN_PROBE)
        return end if found else ""

    def _added_text(self, rendered: str) -> str:
        if rendered.startswith(self._rendered):
            return rendered[len(self._rendered):]
        self.prefix_stable = False
        return rendered[_common_prefix_length(self._rendered, rendered):]

    def _prompted_rendering(self) -> str:
        """The conversation rendered with the generation prompt, once per length of the conversation."""
        if self._prompted is None or self._prompted[0] != len(self._turns):
            self._prompted = (len(self._turns), self._render(self.messages, add_generation_prompt=True))
        return self._prompted[1]

    def _render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        return self.template.render(messages, self.tools, add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.bos_token_id
        if self._turns or not self.template.prepend_bos or bos is None or ids[:1] == [bos]:
            return ids
        return [bos, *ids]

    def _record(self, turn: RenderedTurn, rendered: str) -> None:
        self._turns.append(turn)
        self._ids.extend(turn.token_ids)
        self._rendered = rendered


def _message_local(template: ChatTemplate) -> MessageLocalTemplate | None:
    return cast(MessageLocalTemplate, template) if callable(getattr(template, "message_text", None)) else None


def _without_end(written: str, end_text: str) -> str:
    return written[:len(written) - _marker_overlap(written, end_text)]


def _marker_overlap(written: str, end_text: str) -> int:
    """How much of `end_text` the text ends with, counted only when it holds the whole end-of-turn marker.

    A reply ending in "<" has not started "<|im_end|>"; one ending in "<|im_end|>" lacks only the newline.
    """
    overlap = _overlap(written, end_text)
    return overlap if overlap >= len(end_text.rstrip()) else 0


def _overlap(written: Sequence[T], end: Sequence[T]) -> int:
    """The length of the longest start of `end` that `written` ends with."""
    for size in range(min(len(written), len(end)), 0, -1):
        if written[len(written) - size:] == end[:size]:
            return size
    return 0


def _common_prefix_length(first: str, second: str) -> int:
    return next((index for index, (a, b) in enumerate(zip(first, second, strict=False)) if a != b),
                min(len(first), len(second)))
