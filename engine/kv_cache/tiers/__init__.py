"""KV tiers below the device pool: host and persistent stores, load-vs-recompute, prefetch over tool gaps."""
