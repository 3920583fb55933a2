"""OpenAI's Responses API: over HTTP (JSON or SSE) and over a WebSocket, its input and its events."""
