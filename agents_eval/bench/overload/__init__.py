"""`agentserve bench overload`: a configuration's SLO rate found, then twice that rate offered with admission
control at the SLO and without it; admitted requests must keep p99 within the SLO, the rest be refused with
429 or 503 and Retry-After, none time out (docs/agents_eval.md, "Overload")."""

from agents_eval.bench.overload.cli import add_arguments, run

__all__ = ["add_arguments", "run"]
