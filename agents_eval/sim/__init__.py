"""Cluster simulator: discrete-event (simpy) gateways, prefill and decode workers and network links, driving
the project's own policy objects (scheduler and batcher, block manager with prefix caching and session pins,
KV-aware routing with conditional disaggregation, capacity controller, predictor) on a simulated clock, with
step times from a cost model (`cost`) or a calibration fitted to real engine runs (`calibration`).
See docs/simulator.md."""
