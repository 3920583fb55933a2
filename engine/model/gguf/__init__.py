"""GGUF model files: weights, config, tokenizer and chat template read from the file alone."""

from pathlib import Path

GGUF_SUFFIX = ".gguf"


def is_gguf_path(path: Path) -> bool:
    """A model given as a file (or a missing `.gguf` path) is a GGUF file; a directory is a checkpoint."""
    return path.is_file() or (path.suffix == GGUF_SUFFIX and not path.is_dir())
