"""`agentserve bench faults`: agent sessions over HTTP and WebSocket on two replicas sharing Redis while
workers, Redis and a replica are killed on a schedule and clients drop streams; nothing may be lost,
duplicated or corrupted, and no KV block may leak."""

from agents_eval.bench.faults.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
