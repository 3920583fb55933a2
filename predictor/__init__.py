"""agentserve: predictor."""
