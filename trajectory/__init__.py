"""agentserve: trajectory."""
