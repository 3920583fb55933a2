"""engine.workers.worker."""
