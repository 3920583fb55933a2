"""engine.transport.shm.transport."""
