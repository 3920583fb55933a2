"""Deployments a user could pick, compared closed loop (`agentserve bench --workload coding-agent`)."""
