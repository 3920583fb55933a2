"""`python -m agentserve ...`: the same as the `agentserve` command."""

from agentserve.cli import main

main()
