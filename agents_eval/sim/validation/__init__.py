"""Validating the simulator against measured runs: ratios between configurations (`ratios`)."""
