"""The shared-memory transport: rings between processes, and one-copy pulls from the sender's memory."""
