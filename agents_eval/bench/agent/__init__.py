"""`agentserve bench --workload W`: agent sessions through real gateways; SLO-rate search, ablation, seed table."""
