"""`agentserve bench engine`: our engine against transformers' generate."""
