"""`agentserve bench soak`: agent sessions for a long time on one gateway; memory, open descriptors and
latency must stay flat (their slopes are reported)."""

from agents_eval.bench.soak.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
