"""engine.kv_cache.tiers.chain."""
