"""Train the built-in tokenizer, configs/tokenizer/agentserve.model, from the corpus the repo ships.

    .venv/bin/python scripts/train_tokenizer.py                 # train from configs/tokenizer/corpus/*.txt
    .venv/bin/python scripts/train_tokenizer.py --write-corpus  # regenerate generated_*.txt, then train

Sentencepiece BPE, 4096 pieces: <unk>=0, <s>=1 (bos), </s>=2 (eos), <pad>=3, "\\n"=4, bytes <0x00>..<0xFF>
at 5..260, learned pieces after. Identity normalization, no dummy prefix and byte fallback make
decode(encode(s)) give back s. Training is single-threaded on unshuffled input: same corpus, same file.

The corpus is handwritten.txt plus generated_*.txt: seeded synthetic agent traffic (chat, tool calls and
results, accessibility trees, HTML, logs, shell sessions) and text taken from this Python's standard library
(docstrings, source). The generated files are committed, so training never depends on the Python version.
"""

from __future__ import annotations

import argparse
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_DIR = REPO_ROOT / "configs" / "tokenizer"
CORPUS_DIR = TOKENIZER_DIR / "corpus"
MODEL_PATH = TOKENIZER_DIR / "agentserve.model"
VOCAB_SIZE = 4096
SEED = 20240517
SAMPLE = '  def step(self):\n\treturn {"tool": "click", "id": 1234}  # é 中文 🙂\n'

TRAINER_OPTIONS: dict[str, Any] = {
    "model_type": "bpe",
    "vocab_size": VOCAB_SIZE,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": 3,
    "user_defined_symbols": ["\n"],
    "byte_fallback": True,
    "normalization_rule_name": "identity",
    "add_dummy_prefix": False,
    "remove_extra_whitespaces": False,
    "allow_whitespace_only_pieces": True,
    "split_digits": True,
    "character_coverage": 1.0,
    "max_sentence_length": 16384,
    "input_sentence_size": 0,
    "shuffle_input_sentence": False,
    "num_threads": 1,
    "minloglevel": 2,
}

def corpus_files() -> list[Path]:
    return sorted(CORPUS_DIR.glob("*.txt"))


def corpus_lines(files: list[Path]) -> Iterator[str]:
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield line


def train(files: list[Path]) -> bytes:
    model = io.BytesIO()
    spm.set_random_generator_seed(SEED)
    spm.SentencePieceTrainer.train(sentence_iterator=corpus_lines(files), model_writer=model,
                                   **TRAINER_OPTIONS)
    return model.getvalue()


def summary(files: list[Path], model: bytes) -> str:
    sp = spm.SentencePieceProcessor(model_proto=model)
    text = "\n".join(path.read_text(encoding="utf-8") for path in files)
    num_bytes, num_tokens = len(text.encode("utf-8")), len(sp.encode(text))
    ids = sp.encode(SAMPLE)
    digest = hashlib.sha256(model).hexdigest()
    specials = f"unk={sp.unk_id()} bos={sp.bos_id()} eos={sp.eos_id()} pad={sp.pad_id()}"
    round_trip = "ok" if sp.decode(ids) == SAMPLE else "FAILED"
    return "\n".join([
        f"wrote {MODEL_PATH.relative_to(REPO_ROOT)}: {len(model)} bytes, sha256 {digest}",
        f"vocab {sp.get_piece_size()}: {specials}",
        f"corpus: {len(files)} files, {num_bytes} bytes, {num_tokens} tokens "
        f"({num_bytes / num_tokens:.2f} bytes/token)",
        f"sample {SAMPLE!r} -> {len(ids)} tokens, round trip {round_trip}",
        "pieces: " + " ".join(repr(sp.id_to_piece(token_id)) for token_id in ids),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-corpus", action="store_true",
                        help="regenerate configs/tokenizer/corpus/generated_*.txt before training")
    args = parser.parse_args(argv)
    if args.write_corpus:
        from tokenizer_corpus import write_generated_corpus  # beside this script

        for path in write_generated_corpus(CORPUS_DIR):
            print(f"wrote {path.relative_to(REPO_ROOT)}: {path.stat().st_size} bytes")
    files = corpus_files()
    model = train(files)
    MODEL_PATH.write_bytes(model)
    print(summary(files, model))


if __name__ == "__main__":
    main()
