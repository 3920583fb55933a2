"""engine.workers.coordinator."""
