"""A GGUF file's tokenizer and chat template, from its metadata alone, splitting text as llama.cpp does.

`tokenizer.ggml.model` "gpt2" is byte-level BPE: the file's merges, and the pre-tokenizer regexes llama.cpp
(`llama-vocab.cpp`) runs for `tokenizer.ggml.pre`, each splitting the pieces the one before left. "llama" is
sentencepiece BPE: merges ranked by the merged token's score, byte fallback, spaces as "▁" and one more "▁"
before every stretch of text when `tokenizer.ggml.add_space_prefix` holds (llama.cpp's default), after a
special token too. Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain
added tokens, matched whole in the text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from engine.model.gguf.reader import GGUFError, open_gguf
from engine.model.tokenizer import HFTokenizer, TokenizerNotFoundError

KEY = "tokenizer.ggml."
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
SP_SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
ADDED_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)
SPECIAL_TOKEN_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                      "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}

CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
PUNCT_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_SPLIT = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|" + PUNCT_TAIL
QWEN2_SPLIT = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + PUNCT_TAIL
# llama.cpp's stand-in for the original \p{Lu}/\p{Ll} classes: a letter other than a-z, a letter other than A-Z
OTHER, UPPER, LOWER = r"[^\r\n\p{L}\p{N}]?", r"(?:(?=[\p{L}])[^a-z])", r"(?:(?=[\p{L}])[^A-Z])"
SLASH_TAIL = PUNCT_TAIL.replace(r"[\r\n]*", r"[\r\n/]*", 1)
TEKKEN_SPLIT = f"{OTHER}{UPPER}*{LOWER}+|{OTHER}{UPPER}+{LOWER}*|" + r"\p{N}|" + SLASH_TAIL
GPT4O_SPLIT = (f"{OTHER}{UPPER}*{LOWER}+{CONTRACTIONS}?|{OTHER}{UPPER}+{LOWER}*{CONTRACTIONS}?|"
               + r"\p{N}{1,3}|" + SLASH_TAIL)
PUNCTUATION_RUNS = r"[\p{P}\$\+<=>\^~\|]+"


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's regexes for one `tokenizer.ggml.pre`, and whether a word in the vocabulary skips the merges."""

    splits: tuple[str, ...]
    ignore_merges: bool = False


def _family(names: str, splits: tuple[str, ...], ignore_merges: bool = False) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names.split(), PreTokenizer(splits, ignore_merges))


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_family("default", (PUNCTUATION_RUNS, GPT2_SPLIT, r"\p{N}+", "[0-9][0-9][0-9]")),
    **_family("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
              "jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4", (GPT2_SPLIT,)),
    **_family("starcoder refact command-r smollm codeshell exaone minerva-7b", (r"\p{N}", GPT2_SPLIT)),
    **_family("falcon", (PUNCTUATION_RUNS.replace("]+", "`]+"), GPT2_SPLIT, "[0-9][0-9][0-9]")),
    **_family("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", (LLAMA3_SPLIT,),
              ignore_merges=True),
    **_family("dbrx smaug-bpe chatglm-bpe", (LLAMA3_SPLIT,)),
    **_family("qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan", (QWEN2_SPLIT,)),
    **_family("tekken", (TEKKEN_SPLIT,), ignore_merges=True),
    **_family("gpt-4o llama4 kanana2 talkie minimax-m2", (GPT4O_SPLIT,)),
}


class GGUFTokenizerError(ValueError):
    """A GGUF file that cannot be read, or whose tokenizer metadata is missing, malformed or unsupported."""


class GGUFNoTokenizerError(GGUFTokenizerError, TokenizerNotFoundError):
    """The file has no vocabulary at all: the model serves token ids only, as a checkpoint without tokenizer
    files does."""


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer metadata of one GGUF file."""

    path: Path
    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scores: list[float]
    special_ids: dict[str, int]  # keyed like SPECIAL_TOKEN_KEYS: "bos_token", ...
    add_bos_token: bool
    add_space_prefix: bool
    chat_template: str | None

    def special_token_texts(self) -> dict[str, str]:
        """`bos_token`, `eos_token`, ... as the strings a chat template sees."""
        return {name: self.tokens[token_id] for name, token_id in self.special_ids.items()}


def read_gguf_vocab(path: Path) -> GGUFVocab:
    """The file's tokenizer metadata; read once per file version (path, size, modification time)."""
    try:
        stat = Path(path).stat()
    except OSError as error:
        raise GGUFTokenizerError(f"cannot read GGUF file {path}: {error.strerror}") from error
    return _read_vocab(str(path), stat.st_size, stat.st_mtime_ns)


def load_gguf_tokenizer(path: Path) -> HFTokenizer:
    """The tokenizer a GGUF file describes, with its bos and eos ids."""
    vocab = read_gguf_vocab(path)
    return HFTokenizer(build_gguf_tokenizer(vocab), vocab.special_ids.get("bos_token"),
                       vocab.special_ids.get("eos_token"))


def build_gguf_tokenizer(vocab: GGUFVocab) -> tokenizers.Tokenizer:
    """A Hugging Face tokenizer that splits and merges as llama.cpp does for this vocabulary."""
    if vocab.model == "gpt2":
        tokenizer = _byte_level_bpe(vocab)
    elif vocab.model == "llama":
        tokenizer = _sentencepiece_bpe(vocab)
    else:
        raise GGUFTokenizerError(f"{vocab.path}: unsupported GGUF tokenizer model {vocab.model!r} "
                                 "(supported: 'gpt2', 'llama')")
    _add_tokens(tokenizer, vocab)
    return tokenizer


def read_gguf_chat_template(path: Path) -> str | None:
    return read_gguf_vocab(path).chat_template


@functools.lru_cache(maxsize=4)
def _read_vocab(path: str, size: int, mtime_ns: int) -> GGUFVocab:
    fields = _read_fields(Path(path))
    tokens = _list(fields, path, "tokens", str, required=True)
    token_types = _list(fields, path, "token_type", int) or [NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise GGUFTokenizerError(f"{path}: {KEY}token_type has {len(token_types)} entries for {len(tokens)} tokens")
    model = _scalar(fields, path, "model", str, None)
    if model is None:
        raise GGUFTokenizerError(f"{path}: no {KEY}model in the GGUF metadata")
    template = _contents(fields, path, CHAT_TEMPLATE_KEY)
    return GGUFVocab(
        path=Path(path), model=model, pre=_scalar(fields, path, "pre", str, None), tokens=tokens,
        token_types=token_types, merges=_list(fields, path, "merges", str),
        scores=_list(fields, path, "scores", float),
        special_ids=_special_ids(fields, path, len(tokens)),
        add_bos_token=_scalar(fields, path, "add_bos_token", bool, model == "llama"),
        add_space_prefix=_scalar(fields, path, "add_space_prefix", bool, model == "llama"),
        chat_template=template if isinstance(template, str) else None)


def _read_fields(path: Path) -> dict[str, Any]:
    """Every metadata field's value, by name; a file GGUFReader cannot parse is a GGUFTokenizerError."""
    try:
        return dict(open_gguf(path).fields)
    except GGUFError as error:
        raise GGUFTokenizerError(str(error)) from error


def _contents(fields: dict[str, Any], path: str, name: str) -> Any:
    field = fields.get(name)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, IndexError, UnicodeDecodeError) as error:
        raise GGUFTokenizerError(f"{path}: malformed GGUF metadata {name}: {error}") from error


def _list(fields: dict[str, Any], path: str, key: str, kind: type, required: bool = False) -> list[Any]:
    value = _contents(fields, path, KEY + key)
    if value is None and not required:
        return []
    if value is None:
        raise GGUFNoTokenizerError(f"{path}: no {KEY}{key} in the GGUF metadata")
    if not isinstance(value, list) or not value or not all(isinstance(item, kind) for item in value):
        raise GGUFTokenizerError(f"{path}: {KEY}{key} is missing or not a list of {kind.__name__} in the GGUF metadata")
    return value


def _scalar(fields: dict[str, Any], path: str, key: str, kind: type, default: Any) -> Any:
    value = _contents(fields, path, KEY + key)
    if value is None:
        return default
    if isinstance(value, list) or (kind is str) != isinstance(value, str):
        raise GGUFTokenizerError(f"{path}: {KEY}{key} has the wrong type in the GGUF metadata")
    return kind(value)


def _special_ids(fields: dict[str, Any], path: str, vocab_size: int) -> dict[str, int]:
    ids: dict[str, int] = {}
    for name, key in SPECIAL_TOKEN_KEYS.items():
        token_id = _scalar(fields, path, key, int, None)
        if token_id is not None and not 0 <= token_id < vocab_size:
            raise GGUFTokenizerError(f"{path}: {KEY}{key} {token_id} is outside the vocabulary of {vocab_size}")
        if token_id is not None:
            ids[name] = token_id
    return ids


def _byte_level_bpe(vocab: GGUFVocab) -> tokenizers.Tokenizer:
    if not vocab.merges:
        raise GGUFTokenizerError(f"{vocab.path}: a 'gpt2' tokenizer needs {KEY}merges")
    pre = PRE_TOKENIZERS.get(vocab.pre or "default")
    if pre is None:
        raise GGUFTokenizerError(f"{vocab.path}: unsupported GGUF pre-tokenizer {vocab.pre!r}")
    tokenizer = _tokenizer(vocab, vocab=_vocab_dict(vocab, _byte_level_spelling), merges=_merges(vocab),
                           ignore_merges=pre.ignore_merges)
    splits = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre.splits]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(vocab: GGUFVocab) -> tokenizers.Tokenizer:
    if len(vocab.scores) != len(vocab.tokens):
        raise GGUFTokenizerError(f"{vocab.path}: a 'llama' tokenizer needs one {KEY}scores entry per token")
    token_ids = _vocab_dict(vocab, str)
    unk_id = vocab.special_ids.get("unk_token")
    tokenizer = _tokenizer(vocab, vocab=token_ids, merges=_score_merges(vocab, token_ids), fuse_unk=True,
                           byte_fallback=True, unk_token=vocab.tokens[unk_id] if unk_id is not None else None)
    spaces: list[normalizers.Normalizer] = [normalizers.Replace(" ", SP_SPACE)]
    steps: list[decoders.Decoder] = [decoders.Replace(SP_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        spaces.insert(0, normalizers.Prepend(SP_SPACE))
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.normalizer = normalizers.Sequence(spaces)
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _tokenizer(source: GGUFVocab, **bpe: Any) -> tokenizers.Tokenizer:
    try:
        return tokenizers.Tokenizer(models.BPE(**bpe))
    except Exception as error:  # tokenizers raises a bare Exception for a merge of unknown tokens
        raise GGUFTokenizerError(f"{source.path}: bad GGUF vocabulary: {error}") from error


def _vocab_dict(vocab: GGUFVocab, spelling: Callable[[str], str]) -> dict[str, int]:
    """Token -> id; an added token keeps its raw text, so the added vocabulary maps it to its own id."""
    ids: dict[str, int] = {}
    for token_id, (token, token_type) in enumerate(zip(vocab.tokens, vocab.token_types, strict=True)):
        ids.setdefault(token if token_type in ADDED_TYPES else spelling(token), token_id)
    return ids


@functools.cache
def _byte_alphabet() -> tuple[list[str], frozenset[str]]:
    """GPT-2's printable spelling of each byte (`bytes_to_unicode`), and the set of those characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = iter(chr(256 + n) for n in range(256))
    spelling = [chr(byte) if byte in printable else next(others) for byte in range(256)]
    return spelling, frozenset(spelling)


def _byte_level_spelling(token: str) -> str:
    """The token in the byte alphabet: files keep it so already, but for the odd token written as plain text."""
    spelling, alphabet = _byte_alphabet()
    if alphabet.issuperset(token):
        return token
    return "".join(spelling[byte] for byte in token.encode("utf-8"))


def _merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    merges = []
    for merge in vocab.merges:
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise GGUFTokenizerError(f"{vocab.path}: malformed merge {merge!r} in {KEY}merges")
        merges.append((left, right))
    return merges


def _score_merges(vocab: GGUFVocab, token_ids: dict[str, int]) -> list[tuple[str, str]]:
    """Sentencepiece merges: every split of a token into two tokens, best merged score first; ties go as in
    transformers' `generate_merges` (longer left, longer right, then vocabulary order)."""
    ranked: list[tuple[float, int, int, int, int, int, str, str]] = []
    for index, (token, score) in enumerate(zip(vocab.tokens, vocab.scores, strict=True)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in token_ids and right in token_ids:
                ranked.append((-score, -cut, cut - len(token), index, token_ids[left], token_ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_tokens(tokenizer: tokenizers.Tokenizer, vocab: GGUFVocab) -> None:
    tokenizer.add_special_tokens(_added(vocab, (UNKNOWN, CONTROL), special=True))
    tokenizer.add_tokens(_added(vocab, (USER_DEFINED,), special=False))


def _added(vocab: GGUFVocab, kinds: Sequence[int], special: bool) -> list[AddedToken]:
    return [AddedToken(token, special=special, normalized=False)
            for token, token_type in zip(vocab.tokens, vocab.token_types, strict=True) if token_type in kinds]
