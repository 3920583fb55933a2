"""agentserve: gateway."""
