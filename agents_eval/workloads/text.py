"""Prompt text whose token count is known exactly, without tokenizing it.

The vocabulary is every token that is a whole alphabetic ASCII word beginning at a word boundary (sentencepiece's
'▁' or a byte-level BPE's leading space) and that a space followed by the word encodes back to, alone. A block
is words each written with a leading space (" the cat sat"), so a block of n words is exactly n tokens, and
blocks concatenate without their tokens merging: the text of several blocks is the tokens of each in turn.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

from engine.model.loader import load_tokenizer
from engine.model.tokenizer import Tokenizer


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


class WordCut:
    """Counting and cutting a block's text (single-token words): no tokenizer needed."""

    def count(self, text: str) -> int:
        return count_words(text)

    def cut(self, text: str, n_tokens: int) -> str:
        return cut_words(text, n_tokens)


class NoExactPrefixError(ValueError):
    """No prefix of a text encodes to the token count asked for: the count skips it (n - 1, then n + 1)."""


class TokenCut:
    """Counting and cutting any text with the tokenizer: `cut(text, n)` is a prefix of `text` that encodes to
    exactly `n` tokens. The first `n` tokens decoded usually are; otherwise the longest prefix within `n` tokens
    is searched for by characters (a prefix's count rises with its length, but not always by one)."""

    SCAN_CHARS = 16  # prefixes tried below the longest one within n tokens, when that one falls short

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def cut(self, text: str, n_tokens: int, ids: Sequence[int] | None = None) -> str:
        """`ids`: the text's tokens, when the caller has them already."""
        if n_tokens < 1:
            raise ValueError(f"cannot cut text to {n_tokens} tokens")
        ids = self.tokenizer.encode(text) if ids is None else ids
        if len(ids) < n_tokens:
            raise ValueError(f"the text has {len(ids)} tokens, fewer than the {n_tokens} asked for")
        if len(ids) == n_tokens:
            return text
        decoded = self.tokenizer.decode(ids[:n_tokens])
        if text.startswith(decoded) and self.count(decoded) == n_tokens:
            return decoded
        return self._search(text, n_tokens)

    def _search(self, text: str, n_tokens: int) -> str:
        low, high = 0, len(text)  # count(text[:low]) <= n_tokens < count(text[:high])
        while high - low > 1:
            middle = (low + high) // 2
            if self.count(text[:middle]) <= n_tokens:
                low = middle
            else:
                high = middle
        for end in range(low, max(0, low - self.SCAN_CHARS), -1):
            if self.count(text[:end]) == n_tokens:
                return text[:end]
        raise NoExactPrefixError(f"no prefix of the text encodes to exactly {n_tokens} tokens")
