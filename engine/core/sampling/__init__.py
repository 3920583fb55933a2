"""Sampling: parameters and the sampler, a model's defaults, and structured outputs (grammars)."""
