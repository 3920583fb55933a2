"""The HTTP and WebSocket API, one module per surface: chat and completions, Responses, admin, operations."""
