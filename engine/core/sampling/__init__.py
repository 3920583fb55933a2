"""engine.core.sampling."""
