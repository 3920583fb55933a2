"""Calibrating the simulator on the real engine: step-time profiles and the fitted cost model."""
