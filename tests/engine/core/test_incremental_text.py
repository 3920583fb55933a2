"""The reply's text grown from a window of its newest tokens (`IncrementalText`): after every token that ends on a
whole character it is what decoding the whole output gives, and in between it never takes back what it showed.
On the built-in sentencepiece tokenizer, SmolLM2's byte-level BPE and a GGUF sentencepiece vocabulary with
llama.cpp's space prefix (whose decode drops the first token's leading space); over text with leading spaces,
multi-byte characters cut between tokens, special tokens and random token ids; and for a reply taken over
mid-character (`resync`). Stop strings over the grown text: tests/engine/core/test_first_and_final.py."""

from __future__ import annotations

import functools
import itertools
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.output import IncrementalText
from engine.model.loader import load_tokenizer
from engine.model.tokenizer import Tokenizer
from tests.engine.model.test_gguf_tokenizer import builtin_as_gguf_fields, smollm_path, write_gguf

TOKENIZERS = ("builtin", "smollm2", "space-prefix")
GGUF_FOLDER = tempfile.TemporaryDirectory(prefix="space-prefix-")  # removed when the test process ends

TEXTS = ["Hello world, the tool printed three lines.", "naïve 中文 🙂 done", "  two  spaces\n\tand a tab",
         "ls -la /tmp && echo 'ok' → ✓ 日本語のテキスト", "🙂🙂🙂 emoji after emoji ✨"]


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    if name == "space-prefix":
        path = Path(GGUF_FOLDER.name) / "sp.gguf"
        return load_tokenizer(write_gguf(path, add_space_prefix=True, **builtin_as_gguf_fields()))
    return load_tokenizer(None if name == "builtin" else smollm_path())


def test_the_space_prefix_tokenizer_drops_a_leading_space() -> None:
    tokenizer = _tokenizer("space-prefix")
    ids = tokenizer.encode("open the file")
    assert tokenizer.decode(ids[1:]) == tokenizer.decode(ids)[len("open "):]  # so the window needs its context


@pytest.fixture(params=TOKENIZERS)
def tokenizer(request: Any) -> Tokenizer:
    return _tokenizer(request.param)


def grown(tokenizer: Tokenizer, ids: list[int], text: IncrementalText | None = None, start: int = 0) -> list[str]:
    """The text after each of ids[start:], grown one token at a time."""
    text = text or IncrementalText()
    return [text.grow(tokenizer, ids[:end]) for end in range(start + 1, len(ids) + 1)]


def whole(tokenizer: Tokenizer, ids: list[int], start: int = 0) -> list[str]:
    return [tokenizer.decode(ids[:end]) for end in range(start + 1, len(ids) + 1)]


def assert_grows_as_the_whole(tokenizer: Tokenizer, ids: list[int], text: IncrementalText | None = None,
                              start: int = 0, valid: bool = True) -> None:
    """Equal wherever the whole decode ends on a whole character. Inside a character the whole decode of a byte
    fallback tokenizer may show the bytes of characters before it as U+FFFD too (transformers' `ByteFallback`
    replaces a run of byte tokens byte by byte); the grown text keeps them, and adds only to what it showed. That
    holds for `valid` UTF-8 only: a byte token after a lone one turns both to U+FFFD there, in the whole too."""
    grown_texts, whole_texts = grown(tokenizer, ids, text, start), whole(tokenizer, ids, start)
    for index, (ours, theirs) in enumerate(zip(grown_texts, whole_texts, strict=True)):
        if not theirs.endswith("\ufffd"):
            assert ours == theirs, (start + index, ours, theirs)
    shown = [t.rstrip("\ufffd") for t in grown_texts]
    assert not valid or all(later.startswith(earlier) for earlier, later in itertools.pairwise(shown))


@pytest.mark.parametrize("text", TEXTS)
def test_grown_text_is_the_whole_decode_after_every_token(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert_grows_as_the_whole(tokenizer, ids)
    assert grown(tokenizer, ids)[-1] == text


def test_special_tokens_between_words_change_nothing(tokenizer: Tokenizer) -> None:
    specials = [i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None]
    words = tokenizer.encode("open the file then close it")
    ids = [*words[:2], *specials, *words[2:4], *specials, *words[4:]]
    assert_grows_as_the_whole(tokenizer, ids)


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8])
def test_a_reply_taken_over_mid_way_goes_on_as_the_whole(tokenizer: Tokenizer, cut: int) -> None:
    ids = tokenizer.encode("naïve 中文 🙂 done")
    text = IncrementalText()
    assert text.resync(tokenizer, ids[:cut]) == tokenizer.decode(ids[:cut])
    assert_grows_as_the_whole(tokenizer, ids, text, start=cut)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 40))
def test_random_token_ids_grow_as_the_whole(seed: int, length: int) -> None:
    for name in TOKENIZERS:
        tokenizer = _tokenizer(name)
        rng = random.Random(seed)
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(length)]
        assert_grows_as_the_whole(tokenizer, ids, valid=False)
