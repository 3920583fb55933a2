"""Text <-> token ids: a checkpoint's own tokenizer, or the built-in sentencepiece model."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import sentencepiece as spm
import tokenizers

from engine.config import CONFIGS_DIR

BUILTIN_MODEL = CONFIGS_DIR / "tokenizer" / "agentserve.model"
HF_TOKENIZER_FILE = "tokenizer.json"
SP_TOKENIZER_FILE = "tokenizer.model"
SPECIAL_TOKEN_SOURCES = ("tokenizer_config.json", "special_tokens_map.json", "config.json")
SP_META_SPACE = "\u2581"


class TokenizerNotFoundError(ValueError):
    """A checkpoint directory holds neither tokenizer.json nor tokenizer.model."""


class Tokenizer(Protocol):
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class SentencePieceTokenizer:
    """A sentencepiece model; text holding the meta space '▁' is kept intact through its byte pieces."""

    def __init__(self, processor: spm.SentencePieceProcessor, bos_token_id: int | None = None,
                 eos_token_id: int | None = None) -> None:
        self._sp = processor
        self.vocab_size: int = processor.get_piece_size()
        self.bos_token_id = bos_token_id if bos_token_id is not None else _present(processor.bos_id())
        self.eos_token_id = eos_token_id if eos_token_id is not None else _present(processor.eos_id())
        self._meta_space_ids = _byte_piece_ids(processor, SP_META_SPACE)

    @classmethod
    def from_file(cls, path: Path, model_dir: Path | None = None) -> SentencePieceTokenizer:
        processor = spm.SentencePieceProcessor(model_file=str(path))
        if model_dir is None:
            return cls(processor)
        token_to_id = _sp_token_to_id(processor)
        return cls(processor, _special_token_id(model_dir, "bos", token_to_id),
                   _special_token_id(model_dir, "eos", token_to_id))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._encode_escaping_meta_space(encodable(text))
        return _with_bos(ids, self.bos_token_id if add_bos else None)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.decode(list(ids)))

    def piece(self, token_id: int) -> str:
        """The token's sentencepiece spelling ('\u2581' for a space, '<0xNN>' for a byte)."""
        return str(self._sp.id_to_piece(token_id))

    def _encode_escaping_meta_space(self, text: str) -> list[int]:
        if self._meta_space_ids is None or SP_META_SPACE not in text:
            return list(self._sp.encode(text))
        parts = text.split(SP_META_SPACE)
        ids: list[int] = list(self._sp.encode(parts[0]))
        for part in parts[1:]:
            ids += self._meta_space_ids
            ids += self._sp.encode(part)
        return ids


def encodable(text: str) -> str:
    """The text with lone surrogates (valid in JSON escapes, not in UTF-8) replaced by '?', as tokenizers
    need UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class HFTokenizer:
    """A Hugging Face `tokenizer.json`: encode adds no special token but bos on request, decode drops them."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, bos_token_id: int | None,
                 eos_token_id: int | None) -> None:
        self._tok = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    @classmethod
    def from_dir(cls, model_dir: Path) -> HFTokenizer:
        tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / HF_TOKENIZER_FILE))
        return cls(tokenizer, _special_token_id(model_dir, "bos", tokenizer.token_to_id),
                   _special_token_id(model_dir, "eos", tokenizer.token_to_id))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(encodable(text), add_special_tokens=False).ids
        return _with_bos(ids, self.bos_token_id if add_bos else None)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def backend_json(self) -> str:
        """The whole tokenizer as `tokenizer.json` text (what a grammar library builds its token trie from)."""
        return str(self._tok.to_str())


def _special_token_id(model_dir: Path, name: str, token_to_id: Callable[[str], int | None]) -> int | None:
    """First of `<name>_token` / `<name>_token_id` in the special-token files that names a known token."""
    for filename in SPECIAL_TOKEN_SOURCES:
        settings = _read_json_object(model_dir / filename)
        for key in (f"{name}_token", f"{name}_token_id"):
            token_id = _resolve_token(settings.get(key), token_to_id)
            if token_id is not None:
                return token_id
    return None


def _resolve_token(value: Any, token_to_id: Callable[[str], int | None]) -> int | None:
    """A token given as an id, a list of ids (the first counts), a string, or an AddedToken dict."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, list) and value:
        return _resolve_token(value[0], token_to_id)
    if isinstance(value, dict):
        return _resolve_token(value.get("content"), token_to_id)
    if isinstance(value, str):
        return token_to_id(value)
    return None


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _sp_token_to_id(processor: spm.SentencePieceProcessor) -> Callable[[str], int | None]:
    def token_to_id(piece: str) -> int | None:
        token_id = int(processor.piece_to_id(piece))
        return token_id if processor.id_to_piece(token_id) == piece else None
    return token_to_id


def _byte_piece_ids(processor: spm.SentencePieceProcessor, char: str) -> list[int] | None:
    """The byte-fallback ids spelling `char`, or None when the model has no byte pieces."""
    ids = [int(processor.piece_to_id(f"<0x{byte:02X}>")) for byte in char.encode("utf-8")]
    return ids if all(processor.is_byte(token_id) for token_id in ids) else None


def _present(token_id: int) -> int | None:
    """sentencepiece reports a disabled special token as a negative id."""
    return token_id if token_id >= 0 else None


def _with_bos(ids: list[int], bos_token_id: int | None) -> list[int]:
    return [bos_token_id, *ids] if bos_token_id is not None else ids
