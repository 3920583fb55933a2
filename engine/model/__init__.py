"""engine.model.llama."""
