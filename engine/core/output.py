"""Per-step request outputs: incremental detokenization and stop conditions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.core.sampling.sampler import TokenLogprob
from engine.core.sequence import Sequence


class Detokenizer(Protocol):
    def decode(self, ids: list[int]) -> str: ...


@dataclass
class RequestOutput:
    """What one step produced for one request: deltas since the previous output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_cached_tokens: int
    logits: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


CONTEXT_TOKENS = 5  # a resumed reply's window starts this many tokens back, so a leading space decodes as in the whole


@dataclass
class IncrementalText:
    """A reply's text grown token by token from a window of its newest tokens, not the whole output each step (the
    prefix and read offsets of TGI's and vLLM's detokenizers). `done` is the text of the tokens before `read`, which
    ends on a whole character; the window decodes from `prefix`, a few tokens earlier, so that a token's leading
    space comes out as it does in the whole output (a tokenizer drops it at the start of what it decodes)."""

    done: str = ""
    prefix: int = 0
    read: int = 0

    def grow(self, tokenizer: Detokenizer, ids: list[int]) -> str:
        """The text of all of `ids` (the tokens before `read` unchanged since the last call): `done`, then the
        newest tokens' text, with U+FFFD where they end inside a character."""
        before = tokenizer.decode(ids[self.prefix:self.read]) if self.read > self.prefix else ""
        window = tokenizer.decode(ids[self.prefix:])
        if len(window) <= len(before) or window.endswith("\ufffd"):  # a special token, or inside a character: wait
            return self.done + window[len(before):]
        if not window.startswith(before):  # a tokenizer whose cleanup rewrites earlier text: decode the whole
            return self.resync(tokenizer, ids)
        self.done += window[len(before):]
        self.prefix, self.read = self.read, len(ids)
        return self.done

    def resync(self, tokenizer: Detokenizer, ids: list[int]) -> str:
        """Start over from the whole output (a reply taken over from another worker); its text. The window's
        context must decode as the end of the whole does: a byte-fallback decoder shows a run of byte tokens cut at
        its start as U+FFFD."""
        text = tokenizer.decode(ids)
        self.read, self.done = len(ids), text
        while self.done.endswith("\ufffd") and self.read > max(0, len(ids) - 3):  # a character has at most 4 bytes
            self.read -= 1
            self.done = tokenizer.decode(ids[:self.read])
        first = max(0, self.read - CONTEXT_TOKENS)
        starts = range(first, max(0, self.read - 2 * CONTEXT_TOKENS) - 1, -1)
        self.prefix = next((p for p in starts if self.done.endswith(tokenizer.decode(ids[p:self.read]))), first)
        return text


@dataclass
class _TextState:
    text: str = ""  # full decoded output, truncated at a stop string
    decoded: IncrementalText = field(default_factory=IncrementalText)
    emitted_chars: int = 0
    emitted_tokens: int = 0
    held_logits: list[torch.Tensor] = field(default_factory=list)  # of the steps since the last output
    held_logprobs: list[TokenLogprob] = field(default_factory=list)


class OutputProcessor:
    """Decides when a sequence stops and turns its progress into `RequestOutput` deltas.

    Text is held back while it could still be the start of a stop string or ends inside a multi-byte
    character, so streamed text never has to be taken back. A request without `every_token` (a reply not
    streamed) gets two outputs: its first token's and its last, which carries every delta since, as vLLM's
    `FINAL_ONLY` with the first token kept (it retires the prompt's admitted work and times the TTFT); a
    reply of n tokens is then two messages from a worker and two hand-offs to the caller's event loop, not n.
    A streamed reply gets its first token's output, then one every `stream_interval` tokens, then its last.
    """

    def __init__(self, tokenizer: Detokenizer, eos_token_ids: tuple[int, ...], max_model_len: int,
                 stream_interval: int = 1) -> None:  # EngineSettings refuses an interval below 1
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len
        self.stream_interval = stream_interval
        self._states: dict[str, _TextState] = {}

    def check_stop(self, seq: Sequence) -> str | None:
        """Finish reason after the sequence's newest token, or None to go on."""
        state = self._states.setdefault(seq.request_id, _TextState())
        token = seq.output_token_ids[-1]
        text = state.decoded.grow(self.tokenizer, seq.output_token_ids)
        stop_at = _find_stop(text, seq.params.stop, len(state.text))
        state.text = text if stop_at is None else text[:stop_at]
        if stop_at is not None or token in seq.params.stop_token_ids:
            return "stop"
        if token in self.eos_token_ids and not seq.params.ignore_eos:
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def resume(self, seq: Sequence) -> None:
        """Take over a sequence whose outputs so far were streamed by another worker."""
        decoded = IncrementalText()
        text = decoded.resync(self.tokenizer, seq.output_token_ids)
        self._states[seq.request_id] = _TextState(text, decoded, _stable_length(text, seq.params.stop),
                                                  len(seq.output_token_ids))

    def make_output(self, seq: Sequence, logits: list[torch.Tensor] | None = None,
                    logprobs: list[TokenLogprob] | None = None) -> RequestOutput | None:
        """The request's delta since its last output; None while its delta is held (it grows until then): past
        the first token and not finished, without `every_token`, or with fewer than `stream_interval` tokens."""
        state = self._states.setdefault(seq.request_id, _TextState())
        if _held_back(seq, state, self.stream_interval):
            state.held_logits += logits or []
            state.held_logprobs += logprobs or []
            return None
        logits, logprobs = state.held_logits + (logits or []), state.held_logprobs + (logprobs or [])
        state.held_logits, state.held_logprobs = [], []
        final = seq.is_finished and seq.finish_reason != "prefilled"  # a hand-off goes on elsewhere
        visible = len(state.text) if final else _stable_length(state.text, seq.params.stop)
        new_text = state.text[state.emitted_chars:visible] if visible > state.emitted_chars else ""
        state.emitted_chars = max(state.emitted_chars, visible)
        new_tokens = seq.output_token_ids[state.emitted_tokens:]
        state.emitted_tokens = len(seq.output_token_ids)
        if seq.is_finished:
            del self._states[seq.request_id]
        return RequestOutput(seq.request_id, new_tokens, new_text, seq.is_finished, seq.finish_reason,
                             seq.num_prompt_tokens, seq.num_cached_tokens or 0, logits, logprobs)


def _held_back(seq: Sequence, state: _TextState, interval: int) -> bool:
    if seq.is_finished or state.emitted_tokens == 0:
        return False
    return not seq.params.every_token or len(seq.output_token_ids) - state.emitted_tokens < interval


def _find_stop(text: str, stops: list[str], checked_upto: int) -> int | None:
    """Index of the earliest stop string that ends after `checked_upto`, or None."""
    found = None
    for stop in stops:
        index = text.find(stop, max(0, checked_upto - len(stop) + 1))
        if index >= 0 and (found is None or index < found):
            found = index
    return found


def _stable_length(text: str, stops: list[str]) -> int:
    """How much of text can be streamed now: no partial stop string, no unfinished character."""
    end = len(text.rstrip("\ufffd"))
    held = max((_partial_stop_size(text, end, stop) for stop in stops), default=0)
    return end - held


def _partial_stop_size(text: str, end: int, stop: str) -> int:
    """Length of the longest proper prefix of stop that text[:end] ends with (without copying text[:end])."""
    for size in range(min(len(stop) - 1, end), 0, -1):
        if text.endswith(stop[:size], 0, end):
            return size
    return 0
