"""`agentserve bench gateway`: gateway overhead over its engine; Responses WebSocket against chat turns."""
