"""Prompt text whose token count is known exactly, without tokenizing it.

The vocabulary is every token that is a whole alphabetic ASCII word beginning at a word boundary (sentencepiece's
'▁' or a byte-level BPE's leading space) and that a space followed by the word encodes back to, alone. A block
is words each written with a leading space (" the cat sat"), so a block of n words is exactly n tokens, and
blocks concatenate without their tokens merging: the text of several blocks is the tokens of each in turn.
"""

from __future__ import annotations

import random
from collections.abc import Hashable

from engine.tokenizer import Tokenizer, load_tokenizer


def single_token_words(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The words that are one token each after a space, in token-id order."""
    words = []
    for token_id in range(tokenizer.vocab_size):
        word = tokenizer.decode([token_id]).strip()
        if word.isascii() and word.isalpha() and tokenizer.encode(" " + word) == [token_id]:
            words.append(word)
    return tuple(words)


def cut_words(text: str, n_tokens: int) -> str:
    """The first `n_tokens` words (tokens) of a block's text."""
    return "".join(" " + word for word in text.split()[:n_tokens])


def count_words(text: str) -> int:
    """Tokens of a block's text: its words."""
    return len(text.split())


class TokenText:
    """Seeded blocks of single-token words: `block(key, n)` is the same text for the same key, n and seed, and
    `block(key, k)` is the first k words of `block(key, n)` for k < n (a block's prefix is its shorter self)."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, words: tuple[str, ...] | None = None) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.words = single_token_words(tokenizer) if words is None else words
        if not self.words:
            raise ValueError("the tokenizer has no single-token words to build prompt text from")

    @classmethod
    def builtin(cls, seed: int = 0) -> TokenText:
        """Over the built-in sentencepiece tokenizer shared by the `tiny` and `small` models."""
        return cls(load_tokenizer(None), seed)

    def block(self, key: Hashable, n_tokens: int) -> str:
        rng = random.Random(f"{self.seed}:{key!r}")
        return "".join(" " + word for word in rng.choices(self.words, k=n_tokens))

    def with_seed(self, seed: int) -> TokenText:
        """The same vocabulary under another seed, without scanning the tokenizer again."""
        return TokenText(self.tokenizer, seed, self.words)
