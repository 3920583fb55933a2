"""KV tiers: the device pool's blocks and eviction policy, host and persistent stores, load-vs-recompute,
prefetch over tool gaps (docs/kv_cache.md).

Torch-free but for `device_io` and `engine_tiers`, so the simulator and `bench kv-cache` run the same objects.
"""
