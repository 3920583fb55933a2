"""`agentserve bench trajectory`: turn-delta reuse, trace replay, pruning, KV, phase shifts."""
