"""`agentserve bench disagg`: prefill/decode interference, KV hiding, role switches."""
