"""agentserve: the `agentserve` command, a thin dispatcher over the packages' own command modules."""
