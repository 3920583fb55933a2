"""engine.transport.tcp.transport."""
