"""`agentserve bench kv-cache`: the seed's improved LFU against LRU and against an unbounded cache, replaying
a Mooncake-format trace's block ids at several cache sizes (docs/kv_cache.md)."""

from agents_eval.bench.kv_cache.bench import add_arguments, run, run_benchmark

__all__ = ["add_arguments", "run", "run_benchmark"]
