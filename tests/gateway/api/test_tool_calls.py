"""Tool calls in generated text: the parser, and the chat stream writer holding call markup back.

The random-weight model never writes a tool call, so these feed constructed engine outputs.
"""

from __future__ import annotations

import json
from typing import Any

from engine.core.output import RequestOutput
from gateway.api.generation import Usage
from gateway.api.streaming import ChatStreamWriter
from gateway.api.tool_calls import parse_tool_calls

LS_CALL = '<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call>'


def output(text: str, finish_reason: str | None = None) -> RequestOutput:
    return RequestOutput("req-1", [7] * max(1, len(text) // 4), text, finish_reason is not None, finish_reason,
                         num_prompt_tokens=10, num_cached_tokens=0)


def stream(writer: ChatStreamWriter, *pieces: str, finish_reason: str = "stop") -> list[dict[str, Any]]:
    chunks = []
    for i, piece in enumerate(pieces):
        chunks += writer.add(0, output(piece, finish_reason if i == len(pieces) - 1 else None))
    return chunks


def content(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_a_call_becomes_openai_shaped() -> None:
    text, calls = parse_tool_calls(f"Listing.\n{LS_CALL}")
    assert text == "Listing."
    [call] = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "shell", "arguments": json.dumps({"command": "ls"})}


def test_ids_and_string_arguments_are_kept_and_several_calls_parse() -> None:
    text = ('<tool_call>{"id": "call_a", "name": "read", "arguments": "{\\"path\\": \\"x\\"}"}</tool_call>\n'
            '<tool_call>{"name": "read", "arguments": {"path": "y"}}</tool_call>')
    content_text, calls = parse_tool_calls(text)
    assert content_text == ""
    assert calls[0]["id"] == "call_a" and calls[0]["function"]["arguments"] == '{"path": "x"}'
    assert calls[1]["id"] != calls[0]["id"] and json.loads(calls[1]["function"]["arguments"]) == {"path": "y"}


def test_malformed_calls_stay_text() -> None:
    for text in ['<tool_call>{"name": broken}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                 "<tool_call>[1, 2]</tool_call>", '<tool_call>{"name": "ls"}', "  plain text  "]:
        assert parse_tool_calls(text) == (text, [])


def test_call_markup_is_held_back_and_sent_as_tool_calls() -> None:
    writer = ChatStreamWriter("tiny", parse_tools=True, n=1)
    chunks = stream(writer, "Let me look. <to", "ol_ca", LS_CALL.removeprefix("<tool_ca"))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "<" not in content(chunks) and content(chunks).strip() == "Let me look."
    finish = chunks[-1]["choices"][0]
    assert finish["finish_reason"] == "tool_calls"
    [streamed_call] = finish["delta"]["tool_calls"]
    assert streamed_call["index"] == 0 and streamed_call["function"]["name"] == "shell"

    message = writer.completion(Usage())["choices"][0]["message"]
    assert message["content"] == "Let me look."
    assert writer.completion(Usage())["choices"][0]["finish_reason"] == "tool_calls"
    # one id for the call everywhere: in the stream, in the completion object and in the session's history
    assert message["tool_calls"][0]["id"] == streamed_call["id"]
    reply = writer.reply(0)
    assert reply.tool_calls is not None and reply.tool_calls[0]["id"] == streamed_call["id"]
    assert reply.content == "Let me look."


def test_a_call_only_reply_has_null_content() -> None:
    writer = ChatStreamWriter("tiny", parse_tools=True, n=1)
    chunks = stream(writer, LS_CALL[:5], LS_CALL[5:])
    assert content(chunks) == ""
    message = writer.completion(Usage())["choices"][0]["message"]
    assert message["content"] is None and len(message["tool_calls"]) == 1


def test_a_partial_marker_that_is_not_a_call_is_released() -> None:
    writer = ChatStreamWriter("tiny", parse_tools=True, n=1)
    first = writer.add(0, output("Use <to"))
    assert content(first) == "Use "
    assert content(writer.add(0, output("ols wisely"))) == "<tools wisely"
    last = writer.add(0, output(".", "length"))
    assert content(last) == "." and last[-1]["choices"][0]["finish_reason"] == "length"


def test_a_malformed_or_truncated_call_is_flushed_as_text_at_the_end() -> None:
    for pieces, reason in [(("Run <tool_call>{\"name\": oops}", "</tool_call>"), "stop"),
                           (("Run <tool_call>{\"name\": \"shell\", \"argu",), "length")]:
        writer = ChatStreamWriter("tiny", parse_tools=True, n=1)
        chunks = stream(writer, *pieces, finish_reason=reason)
        assert content(chunks) == "".join(pieces)
        assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}


def test_without_tools_markup_is_plain_content() -> None:
    writer = ChatStreamWriter("tiny", parse_tools=False, n=1)
    chunks = stream(writer, LS_CALL[:20], LS_CALL[20:])
    assert content(chunks) == LS_CALL and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert writer.reply(0).tool_calls is None


def test_an_aborted_choice_reports_stop_and_choices_stream_by_index() -> None:
    writer = ChatStreamWriter("tiny", parse_tools=False, n=2)
    first = writer.add(1, output("b"))
    assert [c["choices"][0]["index"] for c in first] == [1, 1]
    assert first[0]["choices"][0]["delta"]["role"] == "assistant"
    writer.add(0, output("a", "length"))
    assert writer.add(1, output("", "abort"))[-1]["choices"][0]["finish_reason"] == "stop"
    choices = writer.completion(Usage())["choices"]
    assert [(c["message"]["content"], c["finish_reason"]) for c in choices] == [("a", "length"), ("b", "stop")]
