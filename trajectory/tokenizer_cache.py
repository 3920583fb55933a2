"""A tokenizer that encodes each short text once: the chat template's markers (the assistant header, the end
of a turn), which every turn of every session encodes again, cost a tokenizer call each otherwise."""

from __future__ import annotations

from collections.abc import Sequence

from engine import Tokenizer

MAX_CHARS = 64  # longer texts (messages) go straight to the tokenizer
MAX_ENTRIES = 4096  # short texts remembered; once full, new ones are encoded each time


class CachingTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.bos_token_id = tokenizer.bos_token_id
        self.eos_token_id = tokenizer.eos_token_id
        self._ids: dict[tuple[str, bool], tuple[int, ...]] = {}

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        if len(text) > MAX_CHARS:
            return self.tokenizer.encode(text, add_bos)
        ids = self._ids.get((text, add_bos))
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_bos))
            if len(self._ids) < MAX_ENTRIES:
                self._ids[text, add_bos] = ids
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)
