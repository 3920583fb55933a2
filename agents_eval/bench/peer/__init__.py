"""`agentserve bench peer`: llama.cpp's server and agentserve on the same GGUF file, the same threads, the same
machine (each alone in turn) and the same client: single-stream decode, long-prompt prefill, and concurrent
agent sessions; ratios agentserve / llama.cpp and the goals they meet (docs/peer.md)."""

from agents_eval.bench.peer.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
