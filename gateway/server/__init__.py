"""The gateway's assembly: the FastAPI app, its per-app state, uvicorn and `agentserve serve`."""
