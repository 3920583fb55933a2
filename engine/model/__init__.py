"""The model: Llama/Qwen2 in plain torch, attention (block-sparse too), masks, loading, the runner, tokenizers, GGUF."""
