"""The simulated cluster: nodes, workers, KV blocks, their costs, and the gateway and controller driving them."""
