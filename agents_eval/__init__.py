"""agentserve: agents_eval."""
