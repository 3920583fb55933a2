"""agentserve: engine."""
