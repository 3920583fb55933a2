"""GGUF model files: weights, config, tokenizer and chat template read from the file alone."""

GGUF_SUFFIX = ".gguf"
